"""Shared test setup: the hardware-boundary fakes come first on sys.path; nothing is left behind.

`import pynvml`, `import amdsmi` and `import gcipuinfo` in any test (and in jpwr code under test) get the
fakes in tests/fakes, which start out as "no such hardware" until a test configures them. Subprocesses get
the same through the `fake_env` fixture (FAKES_DIR first on PYTHONPATH).

A session fails when it leaves anything of ours in /tmp or /etc/hosts (see LEFTOVER_NAMES).

Under pytest-xdist (tests/run.sh: `-n 3`) a file whose tests share a module-scoped fixture runs whole
on one worker (the fixture runs once), the files that use something machine-wide run one after another on one worker
(MACHINE_WIDE_FIXTURES), other tests go to whichever worker is free, and the leftover check and the per-file durations
run once, on the controller.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
FAKES_DIR = TESTS_DIR / "fakes"
H100_TRACE_DIR = TESTS_DIR / "data" / "h100_trace"
# The host-load check of disturbed runs reads a quiet /proc/loadavg in every test and in every run a test starts
# (drivers, JUBE jobs): this machine's own load (2 cores, the suite's subprocesses) must not change a record or a
# table's note; tests that plant load point JOULEBENCH_LOADAVG at their own file.
os.environ.setdefault("JOULEBENCH_LOADAVG", str(TESTS_DIR / "data" / "loadavg_quiet"))

# Under xdist the workers share the cores: one OpenMP thread per process (torch here and in the runs a test starts), not
# a pool per process spinning on every core (3 workers on 2 cores: a torch subset ran 40% faster on a third less CPU).
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# One pytest process imports TensorFlow (resnet50's TF backend) and torch._dynamo (torchvision, torch.compile).
# Loading triton's libtriton after TensorFlow's bundled LLVM segfaults (TF 2.21, triton 3.x from torch 2.14);
# loaded first, both work. Drivers never import both frameworks in one process.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401

if str(FAKES_DIR) not in sys.path:
    sys.path.insert(0, str(FAKES_DIR))
for _name in ("pynvml", "amdsmi", "gcipuinfo"):  # drop a real library imported before us
    if _name in sys.modules and not str(getattr(sys.modules[_name], "__file__", "")).startswith(str(FAKES_DIR)):
        del sys.modules[_name]


@pytest.fixture
def roomy_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """validate's host-memory check sees a 1 TiB node (a fake /proc/meminfo): for tests of what a profile resolves
    to, where what this machine has free is not the question (the check has its own tests)."""
    from joulebench.host_memory import MEMINFO_ENV

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {2**30} kB\nMemAvailable: {2**30} kB\n")
    monkeypatch.setenv(MEMINFO_ENV, str(meminfo))


@pytest.fixture
def h100_trace_dir() -> Path:
    return H100_TRACE_DIR


@pytest.fixture
def fake_pynvml() -> Iterator[object]:
    """The fake pynvml module, reset to 'no driver' after the test; call .configure(...) to replay."""
    import pynvml

    pynvml.reset()
    yield pynvml
    pynvml.reset()


@pytest.fixture
def fake_amdsmi() -> Iterator[object]:
    import amdsmi

    amdsmi.reset()
    yield amdsmi
    amdsmi.reset()


@pytest.fixture
def fake_gcipuinfo() -> Iterator[object]:
    import gcipuinfo

    gcipuinfo.reset()
    yield gcipuinfo
    gcipuinfo.reset()


@pytest.fixture(scope="session")  # stateless: module-scoped fixtures that run a driver once use it too
def fake_env() -> Callable[..., dict[str, str]]:
    """fake_env(JPWR_FAKE_NVML_TRACE=...) -> an environment whose Python imports the fakes and this checkout."""

    def build(**extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(FAKES_DIR), str(TESTS_DIR.parent), env.get("PYTHONPATH", "")])
        env.update(extra)
        return env

    return build


# What the suite creates outside pytest's own tmp_path (under /tmp/pytest-of-<user>, pytest's to keep or prune): the
# local Slurm clusters of jube/slurm-local.sh (/tmp/joulebench-slurm-*, the munge marker, their /etc/hosts lines),
# the samplers' sockets (/tmp/jpwr-*), and tests' own sockets and directories (/tmp/jb-*, /tmp/jpwr-*). Only these
# names are checked, and only entries that appeared during the session: on a shared machine other users create files
# in /tmp as well. A socket a live process is bound to is in use, not left behind (another session's sampler); other
# entries of a second session of this suite running at the same time can still be taken for ours.
LEFTOVER_NAMES = ("joulebench-*", "jpwr-*", "jb-*")
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "joulebench"  # slurm-local.sh's lines end in "# joulebench-slurm-local"
TMP_DIRS = sorted({Path("/tmp"), Path(tempfile.gettempdir())})
_BEFORE = pytest.StashKey[set[str]]()
_STARTED = pytest.StashKey[float]()


def _bound_sockets() -> set[str]:
    """Paths of the Unix sockets live processes are bound to (Linux's /proc/net/unix; empty elsewhere)."""
    with contextlib.suppress(OSError):
        rows = Path("/proc/net/unix").read_text().splitlines()[1:]
        return {fields[7] for fields in (row.split() for row in rows) if len(fields) > 7}
    return set()


def _ours_now() -> set[str]:
    """Our entries in the temporary directories and our lines in /etc/hosts."""
    found = {str(entry) for tmp in TMP_DIRS if tmp.is_dir() for entry in tmp.iterdir()
             if any(fnmatch.fnmatch(entry.name, pattern) for pattern in LEFTOVER_NAMES)}
    with contextlib.suppress(OSError):
        found |= {f"{HOSTS_FILE}: {line}" for line in HOSTS_FILE.read_text().splitlines() if HOSTS_MARK in line}
    return found


def _is_xdist_worker(config: pytest.Config) -> bool:
    """A worker of pytest-xdist (the controller and a plain session are not): it sees only its share of the tests,
    while the other workers' files are still live."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()
    if not _is_xdist_worker(session.config):
        session.config.stash[_BEFORE] = _ours_now()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session, naming each one, for entries the tests left behind (passed or failed); once, after all
    workers finished."""
    if _is_xdist_worker(session.config):
        return
    if _SCOPES_DIR in session.config.stash:
        shutil.rmtree(session.config.stash[_SCOPES_DIR], ignore_errors=True)
    left = sorted(_ours_now() - session.config.stash.get(_BEFORE, set()) - _bound_sockets())
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"the test session left {len(left)} thing(s) behind (tests and fixtures must remove what they create; "
             "jube/slurm-local.sh stop removes a local cluster's):", *(f"  {item}" for item in left)]
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "left behind", red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print("\n".join(lines), file=sys.stderr)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Tests that use or watch something machine-wide: the local Slurm clusters (daemons on fixed ports,
# /tmp/joulebench-slurm-*, /etc/hosts lines; a worker stops at its end a cluster it started) and those marked
# machine_wide (the leftover check's own test counts our entries in /tmp, which others create). Under xdist all files
# holding such a test run on one worker, one after another.
MACHINE_WIDE_FIXTURES = frozenset({"slurm_cluster", "slurm_cluster_4"})
MACHINE_WIDE_SCOPE = "machine-wide"
DURATION_FILES_SHOWN = 25
# Where the workers tell the controller each test's unit of work. xdist's own `xdist_group` marks travel in the node
# ids (name@group), which xdist 3.8 sets through an attribute pytest 9.2 no longer reads: groups never arrive.
_SCOPES_DIR = pytest.StashKey[Path]()
_SCOPES_KEY = "joulebench_scopes_file"


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _shared_fixtures(item: pytest.Item) -> list[str]:
    """The module- and class-scoped fixtures the test uses: one instance (a driver run, a model) for its file's
    tests (session-scoped ones are made once per worker)."""
    defs = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]  # pytest keeps no public accessor
    return sorted(name for name, fixturedefs in defs.items() if fixturedefs[-1].scope in ("module", "class"))


def _scopes(items: list[pytest.Item]) -> dict[str, str]:
    """Each test's unit of work under xdist: the machine-wide files together; the tests of a file that share a
    module-scoped fixture (directly or through another test) together; any other test alone."""
    machine_wide = {_file_of(item.nodeid) for item in items
                    if MACHINE_WIDE_FIXTURES & set(item.fixturenames) or item.get_closest_marker("machine_wide")}
    unit: dict[tuple[str, str], str] = {}  # (file, fixture) -> the unit of its tests
    for item in items:
        file, names = _file_of(item.nodeid), _shared_fixtures(item)
        joined = {unit.get((file, name), f"{file}::{name}") for name in names}  # this test links them: one unit
        for key, value in unit.items():
            if value in joined:
                unit[key] = min(joined)
        unit.update({(file, name): min(joined) for name in names})
    scopes = {}
    for item in items:
        name, shared = _file_of(item.nodeid), _shared_fixtures(item)
        scopes[item.nodeid] = (MACHINE_WIDE_SCOPE if name in machine_wide
                               else unit[(name, shared[0])] if shared else item.nodeid)
    return scopes


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as an interactive shell delivers it: a suite started in the background of a non-interactive shell
    (`bash tests/run.sh &`) inherits SIGINT ignored, every process it starts would inherit that too, and the tests that
    press Ctrl-C on a driver would see it run on to exit 0. Python's own handler here; its children start with the
    default disposition."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the files with slow tests first (so that no long test is left to run alone at the end),
    then the units of work written for the controller's scheduler."""
    if not _is_xdist_worker(config) or _SCOPES_KEY not in config.workerinput:  # type: ignore[attr-defined]
        return
    slow_files = {_file_of(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _file_of(item.nodeid) not in slow_files)  # stable; every worker sorts alike
    target = Path(config.workerinput[_SCOPES_KEY])  # type: ignore[attr-defined]
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(_scopes(items)))
    partial.replace(target)


@pytest.hookimpl(optionalhook=True)  # the hooks of pytest-xdist, when it is installed
def pytest_configure_node(node: Any) -> None:
    """Controller: where this worker writes the units of work (read by the scheduler once all have collected)."""
    config = node.config
    if _SCOPES_DIR not in config.stash:
        config.stash[_SCOPES_DIR] = Path(tempfile.mkdtemp(prefix="pytest-xdist-scopes-"))
    node.workerinput[_SCOPES_KEY] = str(config.stash[_SCOPES_DIR] / f"{node.gateway.id}.json")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """For `-n N` (`--dist load`, xdist's default) and `--dist loadgroup`: xdist's scheduling by units of work, the
    units as the workers wrote them (_scopes); the larger units go out first."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WrittenScopeScheduling(LoadScopeScheduling):
        def schedule(self) -> None:  # called once all workers collected (and wrote)
            if not hasattr(self, "scopes"):
                written = sorted(config.stash[_SCOPES_DIR].glob("*.json"))
                self.scopes: dict[str, str] = json.loads(written[0].read_text()) if written else {}
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.scopes.get(nodeid, nodeid)

    return WrittenScopeScheduling(config, log)


def _cpu_seconds() -> float:
    """CPU time of this process and of the processes it has waited for (a test's drivers, JUBE, jpwr; not the Slurm
    daemons, which the cluster's jobs run under): on 2 cores the suite's wall time follows its CPU time."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test's CPU seconds (its setup, call and teardown) travel to the controller in its teardown report."""
    item.user_properties.append(("cpu_started", _cpu_seconds()))


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if call.when == "teardown":
        started = dict(item.user_properties).get("cpu_started")
        if isinstance(started, float):
            item.user_properties.append(("cpu_seconds", _cpu_seconds() - started))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """Where the suite's time goes: each file's tests (setup, call and teardown summed; wall and CPU seconds), slowest
    first."""
    if _is_xdist_worker(config):
        return
    per_file: dict[str, float] = defaultdict(float)
    cpu_per_file: dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                per_file[_file_of(report.nodeid)] += report.duration
                if report.when == "teardown":
                    cpu_per_file[_file_of(report.nodeid)] += float(dict(report.user_properties).get("cpu_seconds", 0.0))
    if not per_file:
        return
    wall = time.monotonic() - config.stash.get(_STARTED, time.monotonic())
    terminalreporter.write_sep("=", f"slowest {min(DURATION_FILES_SHOWN, len(per_file))} of {len(per_file)} test files")
    terminalreporter.write_line(f"{'time':>8}    {'CPU':>8}")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:DURATION_FILES_SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {cpu_per_file[name]:8.1f} s  {name}")
    total, cpu = sum(per_file.values()), sum(cpu_per_file.values())
    terminalreporter.write_line(f"{total:8.1f} s  {cpu:8.1f} s  all {len(per_file)} files (their tests' time and CPU, "
                                f"all workers summed); {wall:.1f} s wall time")
