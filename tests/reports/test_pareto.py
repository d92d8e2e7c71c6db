"""`joulebench report --pareto`: the front, the waste-free point and the exclusions of a power-limit / clock sweep.

Two sources: records written from a small DVFS model stated here (each figure's expectation follows from the model's
shape, not from the code under test), and a sweep measured end to end on fake GPUs (settings applied through
joulebench.device_settings, energy from the production sampler over the fake's clock response).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joulebench.analysis import pareto
from joulebench.analysis.cli import main as joulebench_main
from joulebench.analysis.report import load_runs
from joulebench.device_settings import Privileges, Request, apply, authorize
from joulebench.device_settings.nvml import NvmlDevices
from joulebench.device_settings.record import node_block
from joulebench.record import RunRecord, steady_metrics, write_run_record
from jpwr.energy import Window, WindowEnergy
from jpwr.errors import ValidationError

from .conftest import replay_run

F0 = 1980  # default (boost) SM clock of the model, MHz
CLOCKS = (1830, 1680, 1530, 1380, 1230, 1080, 930, 780)
TOKENS_PER_STEP = 4096
STEPS = 50


def model(clock: float, share: float, static_w: float = 100, dynamic_w: float = 500) -> tuple[float, float]:
    """(time per step s, mean power W) of a step whose `share` of time scales with 1/f and whose power is
    static + dynamic * (f/f0)^2.5."""
    return 0.5 * ((1 - share) + share * F0 / clock), static_w + dynamic_w * (clock / F0) ** 2.5


def write_run(root: Path, run_id: str, request: Request, time_per_step: float, power_w: float, coverage: float = 1.0,
              status: str = "OK", measured: bool = True, model_name: str = "tiny", bound_j: float = 0.5) -> None:
    duration_ns = round(time_per_step * STEPS * 1e9)
    energy = (WindowEnergy(energy_j=power_w * duration_ns / 1e9, mean_power_w=power_w, devices=1, method="counter",
                           coverage=coverage, error_bound_j=bound_j) if measured
              else WindowEnergy.unavailable("no power sensor", devices=1))
    window = Window("steady", 5, 5 + STEPS, 10**9, 10**9 + duration_ns, {"tokens": STEPS * TOKENS_PER_STEP}, energy)
    devices = [] if request.is_empty else [{"power_limit_w": request.power_limit_w or 700.0,
                                            "locked_sm_clock_mhz": request.sm_clock_mhz}]
    record = RunRecord("llm_training", run_id, status=status, status_reason="OOM" if status == "FAILED" else None,
                       config={"model": model_name, "global_batch_size": 8,
                               "device_settings": node_block(request, "nvml", "n1", None, devices)},
                       hardware={"devices": 1}, windows=[window],
                       metrics={**steady_metrics(window, "tokens", devices=1), "devices": 1})
    write_run_record(root / run_id / "run_record.json", record)


WORKLOADS = {
    "memory-bound": (0.05, 100, 500),  # energy falls all the way down; small slowdowns
    "compute-bound": (0.6, 300, 300),  # static power takes over: energy has a minimum inside the sweep
}


def write_sweep(root: Path, workload: tuple[float, float, float]) -> None:
    write_run(root, "default", Request(), *model(F0, *workload))
    for clock in CLOCKS:
        write_run(root, f"clock-{clock}", Request(sm_clock_mhz=clock), *model(clock, *workload))


@pytest.fixture
def clock_sweep(tmp_path):
    """The memory-bound sweep, plus runs whose energy cannot be trusted."""
    workload = WORKLOADS["memory-bound"]
    write_sweep(tmp_path, workload)
    cheaper = model(CLOCKS[0], *workload)
    write_run(tmp_path, "gappy", Request(sm_clock_mhz=CLOCKS[0]), cheaper[0] * 0.9, cheaper[1] * 0.5, coverage=0.8)
    write_run(tmp_path, "crashed", Request(power_limit_w=300), *model(CLOCKS[1], *workload), status="FAILED")
    write_run(tmp_path, "no-sensor", Request(power_limit_w=250), *model(CLOCKS[2], *workload), measured=False)
    return tmp_path, workload


def _energy(clock: float, workload: tuple[float, float, float]) -> float:
    time, power = model(clock, *workload)
    return time * power / TOKENS_PER_STEP


@pytest.mark.parametrize("name", WORKLOADS)
def test_front_and_waste_free_point_follow_the_model(name, tmp_path) -> None:
    workload = WORKLOADS[name]
    write_sweep(tmp_path, workload)
    points = pareto.sweep_points(load_runs([tmp_path]))
    base = pareto.baseline(points)
    assert base.runs == ("default",)
    # time grows as the clock falls; energy falls until static power dominates: the front runs from the default
    # down to the clock of least energy, and the slower clocks below it are dominated
    cheapest = min((F0, *CLOCKS), key=lambda c: _energy(c, workload))
    front = pareto.pareto_front(points)
    assert [p.name for p in front] == ["default" if c == F0 else f"clock-{c}" for c in (F0, *CLOCKS) if c >= cheapest]
    # slowdown = share * (f0/f - 1); energy falls below the default down to `cheapest`: the waste-free point is the
    # lowest clock within 1 % (or the default when none is)
    within = [c for c in CLOCKS if workload[0] * (F0 / c - 1) <= 0.01 and c >= cheapest]
    best = pareto.waste_free(points, base, 0.01)
    assert best is not None and best.name == (f"clock-{min(within)}" if within else "default")
    chosen = min(within, default=F0)
    assert pareto.saving(best, base) == pytest.approx(1 - _energy(chosen, workload) / _energy(F0, workload))
    assert pareto.waste_free(points, base, 0.0).name == "default"


def test_untrustworthy_runs_are_excluded_and_named(clock_sweep, capsys) -> None:
    root, _ = clock_sweep
    assert joulebench_main(["report", "--pareto", str(root)]) == 0
    out = capsys.readouterr().out
    assert "excluded (energy not trustworthy): run gappy (1830 MHz): energy coverage 80 % is below 99 %" in out
    assert "run crashed (300 W): status FAILED: OOM" in out
    assert "run no-sensor (250 W): energy n/a: no power sensor" in out
    points = {p.name: p for p in pareto.sweep_points(load_runs([root]))}
    front = pareto.pareto_front(points.values())
    assert not {"gappy", "crashed", "no-sensor"} & {p.name for p in front}
    assert "waste-free point (least energy within +1.00 % slowdown, measured): 1680 MHz (run clock-1680)" in out


def test_outputs_json_and_chart(clock_sweep, tmp_path) -> None:
    root, _ = clock_sweep
    out = tmp_path / "out"
    assert pareto.main(["--pareto", str(root), "--max-slowdown", "0.5%", "-o", str(out)]) == 0
    data = json.loads((out / "pareto.json").read_text())
    assert data["measured"] is True and data["max_slowdown"] == pytest.approx(0.005)
    assert data["front"][0] == "default" and set(data["excluded"]) == {"gappy", "crashed", "no-sensor"}
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_of_different_workloads_or_without_a_default_are_refused(clock_sweep, tmp_path) -> None:
    root, workload = clock_sweep
    write_run(root, "other-model", Request(sm_clock_mhz=CLOCKS[0]), *model(CLOCKS[0], *workload), model_name="117M")
    with pytest.raises(ValidationError, match="the runs form 2 different workloads"):
        pareto.sweep_points(load_runs([root]))
    lone = tmp_path / "lone"
    write_run(lone, "clock-only", Request(sm_clock_mhz=CLOCKS[0]), *model(CLOCKS[0], *workload))
    with pytest.raises(ValidationError, match="no default-setting run"):
        pareto.baseline(pareto.sweep_points(load_runs([lone])))


def test_the_default_table_fits_160_columns_and_wide_prints_every_column(clock_sweep, capsys) -> None:
    root, _ = clock_sweep
    assert joulebench_main(["report", "--pareto", str(root)]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert joulebench_main(["report", "--pareto", str(root), "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 160 for line in narrow)
    assert narrow[0].split() == ["run", "requested", "SM", "MHz", "W/device", "s/step", "J/token", "slowdown",
                                 "saving", "front", "note"]
    assert {"read", "back", "method", "coverage"} <= set(wide[0].split())  # the columns only --wide prints
    runs = [line.split()[0] for line in wide[1:] if line.split() and line.split()[0] in {"default", "gappy"}]
    for name in runs:  # each run's figures read the same in both
        short = next(line for line in narrow if line.startswith(name + " "))
        long = next(line for line in wide if line.startswith(name + " "))
        assert set(short.split()) - {"waste-free"} <= set(long.split()) | {"<--"}, (short, long)


def test_a_refusal_lists_the_workloads_above_its_one_line_error(clock_sweep, capsys) -> None:
    root, workload = clock_sweep
    write_run(root, "other-model", Request(sm_clock_mhz=CLOCKS[0]), *model(CLOCKS[0], *workload), model_name="117M")
    assert joulebench_main(["report", "--pareto", str(root)]) == 64
    *listed, error = capsys.readouterr().err.splitlines()
    assert error.startswith("joulebench report: error: the runs form 2 different workloads (listed above). Fix: ")
    assert all(len(line) <= 160 for line in [*listed, error])
    workloads = " ".join(listed).split("joulebench report: workload ")[1:]  # a long one goes on, indented
    assert [w.split(":")[0] for w in workloads] == ["1", "2"]
    assert {"other-model", "default", "gappy", "crashed"} <= set(" ".join(workloads).replace(",", " ").split())


@pytest.mark.parametrize(("text", "value"), [("1%", 0.01), ("0.01", 0.01), ("2.5 %", 0.025)])
def test_slowdown_limit_accepts_percent_or_fraction(text, value) -> None:
    assert pareto.parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["1", "150%", "fast"])
def test_ambiguous_slowdown_limits_are_refused(text) -> None:
    with pytest.raises(ValidationError, match=r"Fix: write e\.g\. 1% or 0\.01"):
        pareto.parse_fraction(text)


def test_sweep_measured_on_fake_gpus(tmp_path) -> None:
    """Lock clocks through joulebench.device_settings on fake H100s, meter the steady phase with the production
    sampler: the records carry the read-back clocks, the energies follow the fake's clock response, and the
    waste-free point is the lowest clock whose time stretch stays within the limit. (The recording's steady phase
    ran near 1.4 GHz at its 700 W cap; the clocks swept lie below it.)"""
    steps = 8000  # 1 ms units of the 8 s steady phase

    def locked_at(clock: int | None):
        def sweep_point(replay):
            request = Request(sm_clock_mhz=clock)
            if clock is None:
                return {"device_settings": node_block(request, None, "n1", None, [])}, 1.0
            authorization = authorize("allowed", request, Privileges(euid=0, cap_sys_admin=True), None)
            devices = NvmlDevices()
            _, applied = apply(authorization, request, devices, None, tmp_path / f"state-{clock}.json", "t", "n1")
            block = node_block(request, authorization.route, "n1", None, applied)
            return {"device_settings": block}, replay.phase_time_factor("steady")
        return sweep_point

    clocks = (None, 1380, 1230, 1080)
    for clock in clocks:
        replay_run("steady", tmp_path / "runs" / str(clock), steps=steps, run_id=f"sm-{clock or 'default'}",
                   sweep_point=locked_at(clock))
    points = {p.name: p for p in pareto.sweep_points(load_runs([tmp_path / "runs"]))}
    assert points["sm-1230"].settings.applied_label.endswith("1230 MHz")
    base = pareto.baseline(points.values())
    energies = [points[f"sm-{c or 'default'}"].energy_per_unit_j for c in clocks]
    times = [points[f"sm-{c or 'default'}"].time_per_unit_s for c in clocks]
    assert energies == sorted(energies, reverse=True) and times == sorted(times)
    limit = pareto.slowdown(points["sm-1230"], base)
    best = pareto.waste_free(points.values(), base, limit)
    assert best is not None and best.name == "sm-1230"
