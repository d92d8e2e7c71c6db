"""One load run for both targets (llm_inference/load_run.py): one rate runner, each target offering all it asks, and
a rate that failed before its load still gets its figures (nothing is read from a field the body never set).
Both targets run end to end in test_load.py (the engine) and test_http_load.py (a started server)."""

from __future__ import annotations

import ast
import contextlib
import inspect
from pathlib import Path

import torch

from joulebench.record import RunRecord
from llm_inference.cli import build_parser
from llm_inference.continuous_engine import ContinuousEngine
from llm_inference.http_load import HttpServerTarget
from llm_inference.load import EngineTarget
from llm_inference.load_config import LoadConfig, resolve_load
from llm_inference.load_plan import progress_line
from llm_inference.load_run import LoadTarget, RateOutcome, _rate_metrics
from llm_inference.presets import PRESETS
from llm_inference.runner import BuiltModel

PACKAGE = Path(__file__).resolve().parents[2] / "llm_inference"
CPU = torch.device("cpu")


def _protocol_members() -> dict[str, inspect.Signature | None]:
    members: dict[str, inspect.Signature | None] = {name: None for name in LoadTarget.__annotations__}
    for name, value in vars(LoadTarget).items():
        if inspect.isfunction(value) and not name.startswith("_"):
            members[name] = inspect.signature(value)
    return members


def test_there_is_one_rate_runner_and_both_drivers_use_it():
    runners = [f"{path.name}:{node.name}" for path in sorted(PACKAGE.glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
               and node.name.lstrip("_") in ("run_rate", "run_rates")]
    assert runners == ["load_run.py:run_rate", "load_run.py:run_rates"]
    for driver in ("load.py", "http_load.py"):
        calls = {ast.unparse(node.func) for node in ast.walk(ast.parse((PACKAGE / driver).read_text()))
                 if isinstance(node, ast.Call)}
        assert "run_rates" in calls, driver


def _calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]


def test_both_targets_serve_through_the_one_load_loop_and_build_their_tables_from_one_row_type():
    """One loop (load_loop.run_load) with the engine's and the client's executor; a window rule is asked, never told
    apart by its type; every request table's rows come from request_rows.request_columns."""
    for driver in ("serve_loop.py", "http_load.py"):
        assert "run_load" in {ast.unparse(call.func) for call in _calls(PACKAGE / driver)}, driver
    rules = {"WindowRule", "ArrivalWindow", "SaturatedWindow"}
    for path in sorted(PACKAGE.glob("*.py")):
        for call in _calls(path):
            name = ast.unparse(call.func)
            if name == "isinstance":
                assert not rules & {ast.unparse(n) for n in ast.walk(call.args[1])}, f"{path.name}: {ast.unparse(call)}"
            if name == "RequestsTable":
                assert ast.unparse(call.args[0]).startswith("request_columns("), f"{path.name}: {ast.unparse(call)}"


def test_both_targets_offer_every_member_of_the_target_protocol_with_its_parameters():
    members = _protocol_members()
    assert {"serve", "energy", "check", "figures", "device", "hardware"} <= set(members)
    for target in (EngineTarget, HttpServerTarget):
        for name, signature in members.items():
            if signature is None:  # an attribute: set by the constructor
                assert f"self.{name}" in inspect.getsource(target.__init__), (target.__name__, name)
            else:
                assert list(inspect.signature(getattr(target, name)).parameters) == list(signature.parameters), \
                    (target.__name__, name)


def _failed_before_the_load(cfg: LoadConfig, target: LoadTarget[object]) -> tuple[dict[str, object], RunRecord]:
    """The metrics of a rate whose body raised before the target served anything (every outcome field unset)."""
    record = RunRecord(benchmark="llm_inference", run_id="r")
    outcome: RateOutcome[object] = RateOutcome("2", Path("unused"))
    return _rate_metrics(cfg, 2.0, target, outcome, record), record


def test_a_rate_that_failed_before_its_load_gets_its_figures_from_either_target():
    base = ["load", "--preset", "tiny", "--task", "tiny", "--device", "cpu", "--max-concurrency", "4", "--rate", "2"]
    cfg = resolve_load(build_parser().parse_args(base))
    shape = PRESETS["tiny"]
    never_built = BuiltModel(lambda: ContinuousEngine.from_transformers(torch.nn.Linear(1, 1), CPU), shape, "fp32",
                             CPU, None)
    engine, record = _failed_before_the_load(cfg, EngineTarget(cfg, never_built, shape, "fp32", {}, None))
    assert engine["rate"] == "2" and engine["work_unit"] == "output_tokens"
    assert "energy_per_output_token_j" not in engine
    assert record.config == {"engine_detail": None} and record.requests is None  # the model was never built
    server_cfg = resolve_load(build_parser().parse_args([*base, "--url", "http://127.0.0.1:9"]))
    with contextlib.ExitStack() as stack:
        server, record = _failed_before_the_load(server_cfg, HttpServerTarget(server_cfg, shape, CPU, stack))
    assert server["rate"] == "2" and server_cfg.server is not None and server["engine"] == server_cfg.server.engine
    assert record.config == {"server": None} and record.requests is None  # the server never started


def test_the_progress_line_gives_figures_for_people() -> None:
    """H200, 2026-12-01: `rate max: OK, 1.369e+04 tokens/s, ... p90 TTFT 1.733e+04 ms`; whole numbers from 100 up."""
    record = RunRecord(benchmark="llm_inference", run_id="rate-max", status="OK",
                       metrics={"rate": "max", "output_tokens_per_s": 13686.5, "requests_per_s": 51.86,
                                "energy_per_output_token_j": 0.05047, "ttft_p90_s": 17.33, "tpot_p90_s": 0.01844,
                                "goodput_requests_per_s": 0.0})
    line = progress_line(record)
    assert "e+" not in line
    assert "13686 tokens/s, 51.86 req/s, 0.05047 J/token, p90 TTFT 17330 ms, p90 TPOT 18.44 ms, goodput 0 req/s" in line
