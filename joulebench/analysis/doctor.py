"""`joulebench doctor`: after installing, one command that names each problem of this install with its fix.

    joulebench doctor        # exit 0: the quick start can run; 69: something it needs is missing or broken

It checks, in this Python (the one `joulebench` runs in):
- torch, and that torchvision and transformers import beside it: a torchvision from another index than torch's
  (pip pairs a CPU torch with PyPI's CUDA torchvision where PyTorch's CPU index cannot be reached) installs without
  complaint, then fails at import with `operator torchvision::nms does not exist`, and every transformers command
  with `Could not import module 'LlamaConfig'` (transformers imports torchvision where it is installed);
- the extras each documented workflow needs, and which of their packages are missing;
- the energy sensors the meter finds (what `jpwr info` lists, without probing them);
- JUBE and Slurm on PATH.
The quick start (README) needs torch and the extras llm and reports; a broken torch/torchvision pair counts too, since
the README's install brings torchvision. Everything else is a note: what it affects, and the fix. Each import is
tried in a process of its own (a failed import can leave a process unable to import again).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from joulebench.analysis.extras_needed import (
    QUICK_START_EXTRAS,
    WORKFLOWS,
    extra_requirements,
    install_line,
    installed_as,
    missing_extras,
)
from joulebench.analysis.text_width import fitted
from jpwr import ExitCode
from jpwr.errors import ArgumentParser

PYTORCH_INDEX = "https://download.pytorch.org/whl"
# Runs import statements in order; prints the index of the first that failed and its exception chain, as JSON.
PROBE = """import json, sys
statements = json.loads(sys.argv[1])
for index, statement in enumerate(statements):
    try:
        exec(statement, {})
    except BaseException as exc:
        chain, seen = [], exc
        while seen is not None and len(chain) < 4:
            chain.append(f"{type(seen).__name__}: {str(seen).split('. ')[0]}")
            seen = seen.__cause__ or seen.__context__
        print(json.dumps({"failed": index, "chain": chain}))
        sys.exit(0)
print(json.dumps({"failed": None, "chain": []}))
"""
TORCH, TORCHVISION, TRANSFORMERS = "import torch", "import torchvision", "from transformers import LlamaConfig"


class Findings:
    """The doctor's lines, each printed as it is found: `ok`, `FIX` (blocks the quick start) and `note` (affects
    only what it names)."""

    def __init__(self) -> None:
        self.blocking = 0

    def ok(self, text: str) -> None:
        print(fitted([f"ok    {text}"]), flush=True)

    def fix(self, text: str) -> None:
        self.blocking += 1
        print(fitted([f"FIX   {text}"]), flush=True)

    def note(self, text: str) -> None:
        print(fitted([f"note  {text}"]), flush=True)


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe(statements: Sequence[str]) -> subprocess.Popen[str]:
    """Start a Python of this interpreter (and this environment: PYTHONPATH included) running `statements`."""
    return subprocess.Popen([sys.executable, "-c", PROBE, json.dumps(list(statements))], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def probe_result(process: subprocess.Popen[str]) -> tuple[int | None, str]:
    """(index of the statement that failed or None, its error chain in one line)."""
    out, _ = process.communicate()
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):  # the interpreter died (a crash in a native library): no JSON
        return 0, f"the Python process ended with exit code {process.returncode} before reporting"
    return result["failed"], " <- ".join(result["chain"])


def torch_index(torch_version: str) -> str | None:
    """The wheel index this torch came from, by its local version label (+cpu, +cu126, +rocm6.4); None: PyPI."""
    label = torch_version.partition("+")[2]
    return f"{PYTORCH_INDEX}/{label}" if re.fullmatch(r"cpu|cu\d+|rocm[\d.]+", label) else None


def torchvision_for(torch_version: str) -> str | None:
    """The torchvision release series built for this torch (torch 2.N pairs with torchvision 0.(N+15))."""
    match = re.match(r"2\.(\d+)\.", torch_version)
    return f"0.{int(match.group(1)) + 15}.*" if match else None


def pair_fix(torch_version: str) -> str:
    index = torch_index(torch_version)
    series = torchvision_for(torch_version)
    wanted = f"'torchvision=={series}'" if series else "torchvision"
    where = f" --index-url {index}" if index else ""
    return (f"pip install --force-reinstall --no-deps {wanted}{where} (torchvision from torch's own index, torch "
            "left as it is); where that index cannot be reached, pip uninstall torchvision: only ResNet-50 "
            "(resnet-pytorch) needs it, and transformers runs without it")


def check_torch(found: Findings) -> None:
    """torch imports, torchvision and transformers import beside it."""
    torch_version = version("torch")
    if torch_version is None:
        return  # the llm extra's check names it
    vision_version, transformers_version = version("torchvision"), version("transformers")
    vision = probe([TORCH, TORCHVISION]) if vision_version else None
    hf = probe([TORCH, TRANSFORMERS]) if transformers_version else None
    vision_failed, vision_error = probe_result(vision) if vision else (None, "")
    hf_failed, hf_error = probe_result(hf) if hf else (None, "")
    if 0 in (vision_failed, hf_failed):
        found.fix(f"torch {torch_version} does not import ({vision_error or hf_error}). Fix: reinstall it, from "
                  f"{torch_index(torch_version) or 'your index'}: pip install --force-reinstall torch")
        return
    if vision_failed is not None:
        found.fix(f"torch {torch_version} and torchvision {vision_version} do not belong together: import torchvision "
                  f"fails ({vision_error}). Fix: {pair_fix(torch_version)}")
    elif vision_version:
        found.ok(f"torch {torch_version} and torchvision {vision_version} import together")
    else:
        found.ok(f"torch {torch_version} imports (torchvision is not installed: ResNet-50 needs it)")
    if hf_failed is not None:
        if vision_failed is not None or "torchvision" in hf_error:  # transformers imports torchvision where installed
            found.note(f"transformers {transformers_version} does not import either ({hf_error}): the torchvision "
                       "above is why; the fix above mends both")
        else:
            found.fix(f"transformers {transformers_version} does not import ({hf_error}). Fix: pip install "
                      "--force-reinstall --no-deps transformers")


def check_extras(found: Findings) -> None:
    requirements = extra_requirements()
    for name, doc, extras in WORKFLOWS:
        missing = missing_extras(extras, requirements)
        if not missing:
            found.ok(f"{name} ({doc}): extras {', '.join(installed_as(extras, requirements))} installed")
            continue
        named = "; ".join(f"{extra}: {', '.join(packages)}" for extra, packages in missing.items())
        text = f"{name} ({doc}): extras missing ({named}). Fix: {install_line(list(missing))}"
        if extras is QUICK_START_EXTRAS:
            found.fix(text)
        else:
            found.note(text)


def check_sensors(found: Findings) -> None:
    """What the meter can read here: `jpwr info` without probing (its discovery), one line per backend that found
    sensors, with its devices' kinds and names."""
    info = subprocess.run([sys.executable, "-m", "jpwr", "info", "--probe-seconds", "0"], capture_output=True,
                          text=True, timeout=120)
    if info.returncode != 0:
        error = (info.stderr.strip().splitlines() or ["no message"])[-1]
        found.note(f"sensors: `jpwr info` failed with exit code {info.returncode} ({error}). Fix: run it alone "
                   "(jpwr info --debug) and report it")
        return
    backends, devices = [], []
    for line in info.stdout.splitlines():
        if not line.startswith(" "):
            backends.append(line)
        elif "  kind=" in line:
            kind, name = re.search(r"kind=(\S+)", line), re.search(r"name='([^']*)'", line)
            devices.append(f"{kind.group(1) if kind else '?'} {name.group(1) if name else '?'}")
    available = [line.split(";")[0] for line in backends if ": unavailable" not in line and ":" in line
                 and not line.startswith("jpwr:")]
    if available:
        found.ok(f"sensors: {', '.join(available)} ({', '.join(devices)}); `jpwr info` for read cost and update period")
        return
    reasons = "; ".join(line for line in backends if ": unavailable" in line)
    found.note(f"sensors: none found ({reasons}). Energy is n/a with the reason; the quick start's plot and attribute "
               "stop with exit code 64. Fix: on a GPU machine install its extra (nvidia) or driver; RAPL is usually "
               "readable only as root; without a sensor, `joulebench demo` shows the pipeline on a recorded trace")


def check_tools(found: Findings) -> None:
    """JUBE and Slurm for the JUBE workflows (setup.sh links .venv/bin/jube beside this Python)."""
    jube = shutil.which("jube") or shutil.which("jube", path=str(Path(sys.executable).parent))
    if jube:
        found.ok(f"JUBE: {jube}")
    else:
        found.note("JUBE is not on PATH: the JUBE workflows (docs/jube.md) need it. Fix: sh jube/setup.sh "
                   "(JUBE from the distribution, linked as .venv/bin/jube), or pip install the JUBE release")
    sbatch = shutil.which("sbatch")
    if sbatch:
        found.ok(f"Slurm: {sbatch}")
    else:
        found.note("Slurm (sbatch) is not on PATH: JUBE runs on this machine only (system `local`, the README's main "
                   "job); on a cluster, load its Slurm module")


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="joulebench doctor", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    print(fitted([f"joulebench doctor: Python {sys.version.split()[0]} at {sys.executable}; importing torch, "
                  "torchvision and transformers takes a few seconds"]), flush=True)
    found = Findings()
    check_torch(found)
    check_extras(found)
    check_sensors(found)
    check_tools(found)
    if found.blocking:
        print(f"joulebench doctor: {found.blocking} problem(s) marked FIX block the quick start (exit "
              f"{int(ExitCode.UNAVAILABLE)}); the notes affect only what they name")
        return ExitCode.UNAVAILABLE
    print("joulebench doctor: nothing blocks the quick start (exit 0); the notes affect only what they name")
    return ExitCode.OK
