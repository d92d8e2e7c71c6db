"""`jpwr --metrics-port` scraped by Debian's real Prometheus server on 127.0.0.1: the values it stored are the run's
trace readings, each at its own reading's time, labelled with node, device, run id and the open window; one series
per device and family; a client that connects and sends nothing does not keep jpwr from exiting."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from jpwr.trace import accelerator_domains, load_trace
from tests.driver_helpers import free_port

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed "
                                                                "(sh jube/ci-setup.sh installs it)")
RUN_ID = "prom-1"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read()


@pytest.fixture
def prometheus(tmp_path: Path) -> tuple[str, int]:
    """A Prometheus on 127.0.0.1 scraping the jpwr port every second; (its API base, the jpwr port)."""
    jpwr_port, api_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: jpwr\n"
                      f"    static_configs:\n      - targets: ['127.0.0.1:{jpwr_port}']\n")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{api_port}"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "prometheus.log", "w"))  # noqa: SIM115 (closed with the process)
    base = f"http://127.0.0.1:{api_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(f"{base}/-/ready"):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError((tmp_path / "prometheus.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        yield base, jpwr_port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _series(base: str, metric: str) -> list[dict]:
    query = urllib.parse.urlencode({"query": f'{metric}{{run_id="{RUN_ID}"}}[10m]'})
    reply = json.loads(_get(f"{base}/api/v1/query?{query}"))
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


@needs_prometheus
def test_prometheus_scrapes_the_trace_values_with_their_labels(prometheus, h100_trace_dir, fake_env,
                                                               tmp_path: Path) -> None:
    base, port = prometheus
    out = tmp_path / "jpwr"
    result = subprocess.run([sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(out), "--run-id",
                             RUN_ID, "--metrics-port", str(port), "--", sys.executable, "-c",
                             "import time; time.sleep(8)"],
                            env=fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"jpwr: Prometheus metrics at http://127.0.0.1:{port}/metrics" in result.stderr
    (node_dir,) = [d for d in out.iterdir() if d.is_dir()]
    trace = load_trace(node_dir)
    (gpu,) = accelerator_domains(trace.domains)
    values = {sensor.signal.value: {r.value for r in trace.readings[sensor.id] if r.value is not None}
              for sensor in trace.sensors if sensor.domain_id == gpu.id}
    assert {"power_instant", "power_average"} <= set(values)  # the H100 has both: the instant one is served
    for metric, signals in (("jpwr_energy_joules_total", ("energy_counter",)),
                            ("jpwr_power_watts", ("power_instant",))):
        every = _series(base, metric)  # a scrape before the command's window opened is labelled `none`
        assert {s["metric"]["window"] for s in every} <= {"none", "command"}, every
        (series,) = [s for s in every if s["metric"]["window"] == "command"]
        labels = series["metric"]
        assert (labels["node"], labels["device"], labels["uuid"], labels["window"]) == (
            node_dir.name, gpu.id, gpu.device_uuid, "command")
        samples = [(float(t), float(v)) for t, v in series["values"]]
        assert len(samples) >= 3, samples  # scraped every second over the 8 s command
        traced = set().union(*(values.get(s, set()) for s in signals))
        assert all(v in traced for _, v in samples), (samples, sorted(traced)[:10])  # the trace's own values
        times = [t for t, _ in samples]
        assert times == sorted(set(times))  # each at its reading's own time, never moved by a scrape
    energies = [v for s in _series(base, "jpwr_energy_joules_total") if s["metric"]["window"] == "command"
                for _, v in s["values"]]
    assert float(energies[-1]) >= float(energies[0])  # a counter


def test_one_series_per_device_and_an_idle_client_does_not_keep_jpwr_running(h100_trace_dir, fake_env,
                                                                               tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(tmp_path), "--run-id",
                             RUN_ID, "--metrics-port", str(port), "--", sys.executable, "-c",
                             "import time; time.sleep(3)"],
                            env=fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)), stderr=subprocess.PIPE, text=True)
    idle = socket.socket()
    try:
        deadline = time.monotonic() + 60
        while idle.connect_ex(("127.0.0.1", port)) != 0:  # the idle client: connects and sends nothing
            assert time.monotonic() < deadline and proc.poll() is None, "no metrics endpoint"
            time.sleep(0.1)
        text = ""
        while "jpwr_power_watts{" not in text:  # the first readings
            text = _get(f"http://127.0.0.1:{port}/metrics").decode()
        series = [line.rsplit(" ", 2)[0] for line in text.splitlines() if not line.startswith("#")]
        assert len(series) == len(set(series)) == 2, text  # a counter and a power per device, no duplicate
        # the handler's timeout (30 s) is far off: only not waiting for the idle client lets jpwr end now
        assert proc.wait(timeout=20) == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
    finally:
        idle.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_log_intervals_are_neither_windows_nor_window_labels() -> None:
    from jpwr.channel import Mark
    from jpwr.prometheus import open_window
    from jpwr.windows import spans_from_marks

    marks = [Mark("steady", "begin", 0, 10), Mark("log/0", "begin", 0, 10), Mark("log/0", "end", 5, 20),
             Mark("log/5", "begin", 5, 20)]
    assert open_window(marks) == "steady"
    assert list(spans_from_marks([*marks, Mark("steady", "end", 9, 30)])) == ["steady"]
    assert list(spans_from_marks(marks, intervals=True)) == ["log/0"]  # a query that names an interval


def test_a_busy_metrics_port_is_a_usage_error_naming_the_port(fake_env, tmp_path: Path) -> None:
    """A port another process holds ends `jpwr --metrics-port` as a usage error (64) naming the port and the fix;
    it once died with a TypeError, an "internal error" (70), before the wrapped command ran (issue 42)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "jpwr", "--out", str(tmp_path / "jpwr"), "--metrics-host",
                                 "127.0.0.1", "--metrics-port", str(port), "--", "true"],
                                env=fake_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 64, result.stderr[-3000:]
    assert f"--metrics-port {port} on 127.0.0.1" in result.stderr and "Fix: pick a free port" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
