"""`llm_inference load` against a real OpenAI-compatible server: `transformers serve` on the CPU.

The server loads the tiny preset saved by `save-checkpoint` (no EOS, word-level tokenizer) offline. Energy comes
from jpwr metering the fake pynvml in-process (a recorded H100 trace replayed on real time) as the server's
device: the load, the streams, the windows, the table and the client-side fit are real; the energy figures are
the replayed trace's, not the CPU's. Faults are injected on the wire by tests/llm_inference/fault_proxy.py in front
of the real server, or by a server command that never becomes ready or dies.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from joulebench.requests_table import FILE_NAME, STATUSES, read_requests
from llm_inference import server
from llm_inference.cli import main
from llm_inference.http_load import EXTERNAL_SERVER
from tests.llm_inference.conftest import INFER, run_cmd
from tests.llm_inference.fault_proxy import FAULTS, USAGE_FAULTS, FaultProxy

TRANSFORMERS = Path(sys.executable).parent / "transformers"
# The KV cache bounded: unbounded, transformers' continuous batching sizes it from free memory (14 GB on CI).
SERVE = (f"{TRANSFORMERS} serve {{model}} --device cpu --host {{host}} --port {{port}} --continuous-batching "
         "--cb-num-blocks 256 --cb-block-size 32")
VERSION = f"{sys.executable} -c 'import transformers; print(transformers.__version__)'"
LOAD = ["--task", "tiny", "--device", "cpu", "--max-concurrency", "8", "--output-length", "12",
        "--warmup-requests", "2", "--no-idle-baseline"]
pytestmark = pytest.mark.skipif(not TRANSFORMERS.exists(), reason="transformers[serving] is not installed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    assert main(["save-checkpoint", "--preset", "tiny", "--out", str(out)]) == 0
    return out


def _env(fake_env, h100_trace_dir: Path) -> dict[str, str]:
    return fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), HF_HUB_OFFLINE="1")


def _record(out: Path) -> dict:
    return json.loads((out / "run_record.json").read_text())


@pytest.mark.slow
def test_a_started_server_is_loaded_metered_and_stopped(checkpoint, fake_env, h100_trace_dir, tmp_path):
    out = tmp_path / "load"
    result = run_cmd([*INFER, "load", "--checkpoint", str(checkpoint), *LOAD, "--rates", "6,max", "--requests", "24",
                      "--steady-seconds", "3", "--server-command", SERVE, "--server-version-command", VERSION,
                      "--server-devices", "0", "--energy-methods", "nvml", "--slo-ttft-ms", "2000",
                      "--out-dir", str(out), "--run-id", "http"], _env(fake_env, h100_trace_dir), tmp_path, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    import transformers

    for label in ("6", "max"):
        record = _record(out / f"rate_{label}")
        metrics = record["metrics"]
        assert record["status"] == "OK", record.get("status_reason")
        assert metrics["engine"] == record["config"]["engine"] == "transformers"
        served = record["config"]["server"]
        assert served["version"] == transformers.__version__ and served["devices"] == "0"
        assert served["ready_s"] > 0 and served["first_request_s"] > 0
        # at max the requests sent inside the window count (the engine's rule): not those sent before it opened
        assert (metrics["requests_counted"] == 24) if label == "6" else (0 < metrics["requests_counted"] < 24)
        assert metrics["ttft_p90_s"] >= metrics["ttft_p50_s"] > 0
        assert record["requests"]["output_token_counts"] == {"from usage": 26, "counted from the stream": 0,
                                                             "usage rejected": 0, "rejected by reason": {},
                                                             "rejected first": []}
        assert record["requests"]["failures"]["count"] == 0
        table = read_requests(out / f"rate_{label}" / FILE_NAME)
        assert np.all(table.requests["status"] == STATUSES.index("done"))
        assert np.all(table.requests["output_tokens"] == 12)  # max_tokens honoured: no EOS in the checkpoint
        assert np.all(table.requests["input_tokens"] > 0)  # usage's prompt tokens
        assert len(table.steps["chunk_ns"]) == record["requests"]["chunks"] == 26 * 12
        steady = next(w for w in record["windows"] if w["name"] == "steady")
        assert steady["energy"]["energy_j"] > 0 and metrics["energy_per_output_token_j"] > 0
        energy = record["requests"]["energy"]
        assert energy["estimate"] == "client-side estimate"
        if label == "6":  # a few seconds of load: enough counter segments for the fit (at max ~1 s: n/a, said why)
            assert energy["segments"] >= 20 and energy["method"].startswith("client-side estimate"), energy
            assert np.all(np.isfinite(table.requests["idle_j"]))
        else:
            assert energy.get("segments", 0) >= 20 or "counter segments" in energy["unavailable_reason"], energy
    log = (out / server.LOG_NAME).read_text()
    assert "# joulebench: server stopped by SIGTERM" in log  # stopped at the end, after both rates
    assert "Ignoring unsupported fields" in log or "Request received" in log


@pytest.fixture(scope="class")
def served(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """One `transformers serve` of the checkpoint for the tests of TestFaultsOnTheWire (each puts its own FaultProxy
    in front of it: the faults are the proxy's, the server only answers); its port. Stopped after the class's
    tests, not left idle through the rest of the file."""
    port = server.free_port("127.0.0.1")
    argv = server.render(SERVE, {"model": str(checkpoint), "host": "127.0.0.1", "port": str(port),
                                 "concurrency": "8", "devices": ""})
    log = tmp_path_factory.mktemp("served") / "server.log"
    with server.started(argv, {**os.environ, "HF_HUB_OFFLINE": "1"}, log, "127.0.0.1", port, 120):
        yield port


def _load_through_proxy(checkpoint: Path, port: int, env: dict[str, str], tmp_path: Path, faults: tuple[str, ...],
                        requests: int) -> tuple[subprocess.CompletedProcess, Path]:
    """The server on `port` behind a new FaultProxy with `faults`, loaded at 20 req/s through /v1/completions; the
    load's result and its out-dir."""
    with FaultProxy(port, faults) as proxy:
        out = tmp_path / "load"
        result = run_cmd([*INFER, "load", "--checkpoint", str(checkpoint), *LOAD, "--rate", "20", "--requests",
                          str(requests), "--url", proxy.url, "--api", "completions", "--out-dir", str(out)], env,
                         tmp_path)
    return result, out


class TestFaultsOnTheWire:
    """/v1/completions through a FaultProxy in front of one real server (the `served` fixture, started once)."""

    @pytest.mark.slow
    def test_faults_on_the_wire_are_counted_and_named(self, checkpoint, served, fake_env, h100_trace_dir, tmp_path):
        """/v1/completions through the proxy: 503 answers, a malformed event-stream line, a reset mid-stream: failed
        requests, each named; a stream without `usage`: its tokens counted from the stream. The run itself stays OK
        (most requests succeed)."""
        result, out = _load_through_proxy(checkpoint, served, _env(fake_env, h100_trace_dir), tmp_path, FAULTS, 20)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        record = _record(out)
        failures = record["requests"]["failures"]
        reasons = " ".join(failures["by_reason"])
        assert "HTTP 503" in reasons and "malformed event-stream line" in reasons and "connection lost" in reasons
        assert failures["count"] >= 3 and all(f["reason"] for f in failures["first"])
        assert any("failed or timed out" in w for w in record["warnings"])
        assert record["requests"]["output_token_counts"]["counted from the stream"] >= 1
        table = read_requests(out / FILE_NAME)
        assert int((table.requests["status"] == STATUSES.index("failed")).sum()) == failures["count"]
        # an external server without --server-devices: energy n/a with the reason, never a number
        assert "without --server-devices" in record["requests"]["energy"]["unavailable_reason"]
        # an external server is no child of the run: its processes on the GPUs are not judged, said why
        assert record["disturbed"]["checks"]["other_processes"] == {"disturbed": None,
                                                                    "unavailable_reason": EXTERNAL_SERVER}

    @pytest.mark.slow
    def test_implausible_usage_counts_are_replaced_by_the_stream_s_count(self, checkpoint, served, fake_env,
                                                                         h100_trace_dir, tmp_path):
        """The proxy replaces `usage.completion_tokens` by counts that cannot be true (negative, zero, 4e12, below the
        12 chunks of text, a string): each such request is counted from its stream, and the record says which and why
        (issue 47: an OK record with negative tokens/s or 4e12 tokens/s)."""
        result, out = _load_through_proxy(checkpoint, served, _env(fake_env, h100_trace_dir), tmp_path,
                                          ("pass", *USAGE_FAULTS), 12)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        record = _record(out)
        counts = record["requests"]["output_token_counts"]
        assert counts["from usage"] + counts["counted from the stream"] == 14  # 2 warm-up and 12 counted, all done
        assert counts["usage rejected"] == counts["counted from the stream"] >= len(USAGE_FAULTS)
        assert set(counts["rejected by reason"]) == {"not positive", "above the request's max_tokens",
                                                     "below the chunks that carried text", "not a whole number"}
        assert {r["reported"] for r in counts["rejected first"]} == set(USAGE_FAULTS.values())
        assert any("implausible usage.completion_tokens" in w for w in record["warnings"])
        table = read_requests(out / FILE_NAME)
        rejected = np.isin(table.requests["id"], [r["id"] for r in counts["rejected first"]])
        assert np.all(table.requests["tokens_from_usage"][rejected] == 0)
        assert np.all(table.requests["tokens_from_usage"][~rejected] == 1)
        assert np.all(table.requests["output_tokens"] == 12)  # the stream's count where the server's was rejected
        assert 0 < record["metrics"]["output_tokens_per_s"] < 1e4


def _run_failed(argv: list[str], env: dict[str, str], cwd: Path, out: Path) -> dict:
    result = run_cmd([*INFER, "load", *argv, "--out-dir", str(out)], env, cwd, timeout=200)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    record = _record(out)
    assert record["status"] == "FAILED"
    return record


def test_a_server_that_is_never_ready_fails_the_run_with_its_log(checkpoint, fake_env, tmp_path):
    never = f"{sys.executable} -c 'import time; print(\"loading {{model}}\", flush=True); time.sleep(600)'"
    record = _run_failed(["--checkpoint", str(checkpoint), *LOAD, "--rate", "2", "--server-command", never,
                          "--server-ready-timeout", "2"], fake_env(), tmp_path, tmp_path / "never")
    assert "not ready within 2 s" in record["status_reason"] and "loading" in record["status_reason"]
    assert "stopped by SIGTERM" in (tmp_path / "never" / server.LOG_NAME).read_text()


def test_a_busy_port_fails_the_run_naming_it(checkpoint, fake_env, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        record = _run_failed(["--checkpoint", str(checkpoint), *LOAD, "--rate", "2", "--server-command", SERVE,
                              "--server-port", str(port)], fake_env(), tmp_path, tmp_path / "busy")
    assert f"port {port} on 127.0.0.1 is in use" in record["status_reason"]


@pytest.mark.slow
def test_a_server_killed_mid_run_fails_the_rate_with_its_last_log_lines(checkpoint, fake_env, tmp_path):
    """The server command starts the real server and kills it with SIGKILL 12 s after its port opened, a few seconds
    into the load (counted from the start, a loaded machine's slow start let the kill land on the first request)."""
    port_open = (f'{sys.executable} -c "import socket, sys; '
                 'socket.create_connection((sys.argv[1], int(sys.argv[2])), 1)" {host} {port}')
    dies = (f"sh -c '{SERVE} & pid=$!; until {port_open} 2>/dev/null; do sleep 0.5; done; sleep 12; "
            "echo killing the server; kill -9 $pid; wait $pid'")
    record = _run_failed(["--checkpoint", str(checkpoint), *LOAD, "--rate", "2", "--requests", "80",
                          "--server-command", dies], {**fake_env(), "HF_HUB_OFFLINE": "1"}, tmp_path,
                         tmp_path / "dies")
    assert "the server exited with code" in record["status_reason"] and "killing the server" in record["status_reason"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--server-command", "vllm serve {model} --port {prot}"], "unknown placeholder(s) {prot}"),
    (["--server-command", "vllm serve {model} --name 'open"], "not a valid command line"),
    (["--server-command", "vllm serve {0}"], "unknown placeholder(s) {0}"),
    (["--url", "http://127.0.0.1:8000", "--server-port", "9000"], "--server-port given with --url"),
    (["--url", "http://127.0.0.1:8000", "--decode-tuning", "default"], "--decode-tuning default with a server"),
])
def test_bad_server_options_are_refused_before_anything_starts(checkpoint, argv, message, capsys):
    assert main(["validate-load", "--checkpoint", str(checkpoint), *LOAD, "--rate", "2", *argv]) == 64
    assert message in capsys.readouterr().err


def test_a_started_server_needs_a_checkpoint(capsys):
    assert main(["validate-load", "--preset", "tiny", *LOAD, "--rate", "2", "--server-command", SERVE]) == 64
    assert "save-checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "named"), [
    (["--url", "https://host:1"], "--url"), (["--url", "http://host:1/v1"], "--url"),
    (["--request-extra", "[1]"], "--request-extra"), (["--request-extra", "{x"], "--request-extra"),
    (["--url", "http://a:1", "--server-command", "x"], "not allowed with"),
])
def test_bad_server_values_are_refused_by_the_parser(argv, named, capsys):
    with pytest.raises(SystemExit) as ended:
        main(["validate-load", "--preset", "tiny", *LOAD, "--rate", "2", *argv])
    assert ended.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_stops_the_load_and_the_server(checkpoint, fake_env, tmp_path):
    """SIGTERM during a rate: TIMEOUT record with its table, no later rate, and the server stopped (its log says
    how) before the driver exits."""
    out = tmp_path / "stopped"
    proc = subprocess.Popen([*INFER, "load", "--checkpoint", str(checkpoint), *LOAD, "--rates", "4,max",
                             "--steady-seconds", "120", "--server-command", SERVE, "--out-dir", str(out)],
                            env={**fake_env(), "HF_HUB_OFFLINE": "1"}, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "counted poisson arrivals" in line:
            break
    time.sleep(3.0)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 124, stderr[-3000:]
    record = _record(out / "rate_4")
    assert record["status"] == "TIMEOUT" and "SIGTERM received" in record["status_reason"]
    assert read_requests(out / "rate_4" / FILE_NAME).requests["id"].size == record["requests"]["rows"] > 0
    assert not (out / "rate_max").exists()
    assert "# joulebench: server stopped by SIGTERM" in (out / server.LOG_NAME).read_text()


@pytest.mark.parametrize(("command", "engine"), [
    (SERVE, "transformers"), ("{python} -m sglang.launch_server --model-path {model}", "sglang"),
    ("vllm serve {model} --port {port}", "vllm"),
    ("/opt/tgi/bin/text-generation-launcher --port {port}", "text-generation-launcher"),
])
def test_the_engine_column_names_the_started_program(checkpoint, command, engine):
    from llm_inference.cli import build_parser
    from llm_inference.load_config import resolve_load

    args = build_parser().parse_args(["load", "--checkpoint", str(checkpoint), *LOAD, "--rate", "2",
                                      "--server-command", command])
    assert resolve_load(args).server.engine == engine
