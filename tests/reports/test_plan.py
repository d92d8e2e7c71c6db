"""`joulebench plan`: the exact per-phase clock choice, the best single clock beside it, and its inputs."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joulebench.analysis import plan
from joulebench.analysis.cli import main as joulebench_main
from joulebench.device_settings import Request
from joulebench.device_settings.record import node_block
from joulebench.record import RunRecord, write_run_record
from jpwr.energy import Window
from jpwr.errors import FormatError, ValidationError

STEP_PHASES = ("forward", "backward", "optimizer")


def profile_of(table: dict[str, dict[plan.Clock, tuple[float, float]]]) -> plan.Profile:
    return plan.Profile(list(table), {phase: {clock: plan.Option(t, e, ("test",)) for clock, (t, e) in by.items()}
                                      for phase, by in table.items()}, "a table in the test")


def brute_force(profile: plan.Profile, budget: float, latency: float) -> plan.Plan:
    """Every assignment, evaluated one by one: the oracle for the exact search."""
    feasible = [p for clocks in itertools.product(*(list(profile.options[ph]) for ph in profile.phases))
                if (p := plan.evaluate(profile, clocks, latency)).time_s <= budget * (1 + 1e-12)]
    return min(feasible, key=lambda p: p.energy_j)


# A step of three phases at the default clock and two locked clocks, (time s, energy J) per step, built so that the
# optimum under a 1 % slowdown is known: forward is memory-bound (same time at every clock, least energy at 1110 MHz);
# any lower clock in backward alone costs over 10 % time; the optimizer at 1410 MHz takes exactly the 1 % slack.
KNOWN = {
    "forward": {None: (0.30, 180.0), 1410: (0.30, 150.0), 1110: (0.30, 130.0)},
    "backward": {None: (0.50, 350.0), 1410: (0.60, 330.0), 1110: (0.75, 340.0)},
    "optimizer": {None: (0.05, 40.0), 1410: (0.0585, 30.0), 1110: (0.07, 28.0)},
}


def test_the_known_optimum_is_found_exactly() -> None:
    profile = profile_of(KNOWN)
    default_time = sum(by[None][0] for by in KNOWN.values())
    best = plan.best_plan(profile, default_time * 1.01, 0.0)
    assert best is not None and best.clocks == (1110, None, 1410)
    assert best.energy_j == sum(KNOWN[p][c][1] for p, c in zip(STEP_PHASES, best.clocks, strict=True))
    lines, data = plan.summarise(profile, 0.01, 0.0)
    assert data["plan"]["predicted"] is True and data["best_single_clock"]["clocks"] == [None] * 3
    assert any(line.startswith("per-phase plan (PREDICTED") for line in lines)
    assert "the per-phase plan saves a further" in lines[-1]


def test_switch_latency_can_make_a_switch_not_worth_it() -> None:
    profile = profile_of(KNOWN)
    budget = sum(by[None][0] for by in KNOWN.values()) * 1.01
    latency = 1e-3  # three switches (cyclic) no longer fit the 1 % slack; two do
    best = plan.best_plan(profile, budget, latency)
    assert best == brute_force(profile, budget, latency)
    assert best.clocks == (1110, None, None) and best.switches == 2


def test_one_clock_for_every_phase_means_the_plan_saves_nothing_more() -> None:
    """Memory-bound phases: time is the same at every clock and 1410 MHz costs least in each of them."""
    table = {name: {None: (t, 2.0 * e), 1410: (t, e), 1110: (t, 1.5 * e)}
             for name, t, e in (("forward", 0.3, 100.0), ("backward", 0.5, 200.0), ("optimizer", 0.05, 20.0))}
    profile = profile_of(table)
    lines, data = plan.summarise(profile, 0.01, 0.0)
    assert data["plan"]["clocks"] == [1410] * 3 == data["best_single_clock"]["clocks"]
    assert data["plan"]["energy_j"] == data["best_single_clock"]["energy_j"]
    assert "the per-phase plan saves nothing more than the best single clock" in lines


costs = st.tuples(st.floats(0.001, 2.0), st.floats(0.0, 500.0))


@st.composite
def profiles(draw):
    phases = [f"p{i}" for i in range(draw(st.integers(1, 5)))]
    clocks = [None, *draw(st.lists(st.integers(300, 2000), min_size=0, max_size=3, unique=True))]
    table = {}
    for phase in phases:
        present = [None] + [c for c in clocks[1:] if draw(st.booleans())]
        table[phase] = {c: draw(costs) for c in present}
    return profile_of(table)


@settings(max_examples=300, deadline=None)
@given(profile=profiles(), slowdown=st.floats(0.0, 0.5), latency=st.sampled_from([0.0, 1e-4, 1e-2, 0.1]))
def test_the_search_matches_enumeration(profile, slowdown, latency) -> None:
    budget = plan.evaluate(profile, [None] * len(profile.phases), 0.0).time_s * (1 + slowdown)
    found, oracle = plan.best_plan(profile, budget, latency), brute_force(profile, budget, latency)
    assert found is not None and found.time_s <= budget * (1 + 1e-12)
    assert found.energy_j == pytest.approx(oracle.energy_j, rel=1e-12, abs=1e-12)


# ---- inputs -----------------------------------------------------------------------------------------------------
H100_SM_CLOCKS_MHZ = (210, 1980)  # the supported SM clocks an H100 reports (device_settings apply records them)


def write_attributed_run(root, run_id, clock, phases, steps=20, method="fit", power_limit=None, status="OK"):
    """A run record with the attribution block `joulebench attribute` writes (figures per step; a phase with no
    energy is below resolution)."""
    window = Window("steady", 5, 5 + steps, 10**9, 10**9 + 10**9, {"tokens": 1000.0 * steps})
    request = Request(power_limit_w=power_limit, sm_clock_mhz=clock)
    device = {"index": 0, "locked_sm_clock_mhz": clock, "supported_sm_clock_range_mhz": list(H100_SM_CLOCKS_MHZ)}
    record = RunRecord("llm_training", run_id, status=status, status_reason="x" if status != "OK" else None,
                       config={"device_settings": node_block(request, "nvml", "n1", None, [device])}, windows=[window])
    path = write_run_record(root / run_id / "run_record.json", record)
    data = json.loads(path.read_text())
    rows = [{"phase": name, "status": "below resolution", "seconds_per_step": t} if e is None else
            {"phase": name, "status": "resolved", "seconds_per_step": t, "energy_per_step_j": e,
             "mean_power_w": e / t} for name, (t, e) in phases.items()]
    data["attribution"] = {"window": "steady", "steps": steps, "estimators": {method: {"rows": rows}}}
    path.write_text(json.dumps(data))


def test_profile_from_attributed_run_records(tmp_path) -> None:
    for clock in (None, 1410, 1110):
        write_attributed_run(tmp_path, f"sm-{clock or 'default'}", clock, {p: KNOWN[p][clock] for p in STEP_PHASES})
    write_attributed_run(tmp_path, "replay-only", 1410, {"forward": (1.0, 1.0)}, method="replay")
    write_attributed_run(tmp_path, "capped", None, {"forward": (1.0, 1.0)}, power_limit=300)
    write_attributed_run(tmp_path, "coarse", 1260, {"forward": (0.3, None)})
    profile = plan.profile_from_records([tmp_path], "fit")
    assert profile.phases == list(STEP_PHASES)
    for phase in STEP_PHASES:
        for clock, (t, e) in KNOWN[phase].items():
            assert profile.options[phase][clock].time_s == pytest.approx(t)
            assert profile.options[phase][clock].energy_j == pytest.approx(e)
    assert sorted(profile.excluded) == ["run capped: it sets power_limit=300 W; the plan varies clocks only",
                                        "run coarse: phase forward has no energy or duration (below resolution)",
                                        "run replay-only: no phases by method 'fit'"]
    best = plan.best_plan(profile, sum(KNOWN[p][None][0] for p in STEP_PHASES) * 1.01, 0.0)
    assert best is not None and best.clocks == (1110, None, 1410)


def test_cli_writes_the_profile_and_reads_it_back_as_json_and_csv(tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    for clock in (None, 1410, 1110):
        write_attributed_run(runs, f"sm-{clock or 'default'}", clock, {p: KNOWN[p][clock] for p in STEP_PHASES})
    exported, result = tmp_path / "profile.json", tmp_path / "plan.json"
    assert joulebench_main(["plan", str(runs), "--write-profile", str(exported), "--json", str(result)]) == 0
    from_runs = capsys.readouterr().out
    assert json.loads(result.read_text())["plan"]["clocks"] == [1110, None, 1410]
    assert from_runs.splitlines()[0].startswith("per-phase time and energy per step from attribution method 'fit' "
                                                "of window(s) steady")
    assert plan.main(["--profile", str(exported)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == from_runs.splitlines()[1:]
    csv_file = tmp_path / "profile.csv"
    csv_file.write_text("phase,clock,time_s,energy_j\n" + "".join(
        f"{p},{'default' if c is None else c},{t},{e}\n" for p in STEP_PHASES for c, (t, e) in KNOWN[p].items()))
    assert plan.main(["--profile", str(csv_file)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == from_runs.splitlines()[1:]


def test_bad_inputs_say_what_to_fix(tmp_path) -> None:
    no_default = profile_of({"forward": {1410: (0.3, 100.0)}})
    with pytest.raises(ValidationError, match="phases forward have no figures at the default setting"):
        plan.summarise(no_default, 0.01, 0.0)
    with pytest.raises(ValidationError, match="give either run records or --profile"):
        plan.main([])
    bad = tmp_path / "bad.csv"
    bad.write_text("phase,clock,time_s,energy_j\nforward,fast,0.3,100\n")
    with pytest.raises(FormatError, match="clock 'fast' is neither 'default' nor MHz"):
        plan.main(["--profile", str(bad)])
    with pytest.raises(SystemExit) as ended:  # argparse: the option's stated range
        plan.main(["--profile", str(bad), "--switch-latency", "-1"])
    assert ended.value.code == 2


@pytest.mark.parametrize("clock", ["-1410", "0", "99999999"])
def test_a_clock_no_device_has_is_refused_naming_the_point(tmp_path, clock) -> None:
    """A negative, zero or absurd clock was planned on ("forward -1410 MHz ... saves a further 15.33 %")."""
    profile = tmp_path / "clocks.csv"
    profile.write_text(f"phase,clock,time_s,energy_j\nforward,default,0.3,100\nforward,{clock},0.32,85\n")
    with pytest.raises(FormatError, match=f"point 2 cannot be planned on: clock {int(clock)} MHz is outside 1 to "
                                          "100000 MHz") as refused:
        plan.main(["--profile", str(profile)])
    assert refused.value.exit_code == 65


@pytest.mark.parametrize(("phases", "problem"), [(["forward", "forward"], "phase\\(s\\) forward listed twice"),
                                                 (["forward", ""], "a phase has an empty name")])
def test_a_phase_list_that_is_no_step_is_refused(tmp_path, phases, problem) -> None:
    """A phase named twice was counted twice per step; an empty name is no phase."""
    points = [{"phase": p, "clock": c, "time_s": 0.01, "energy_j": 5.0} for p in set(phases) for c in ("default", 1410)]
    profile = tmp_path / "clocks.json"
    profile.write_text(json.dumps({"kind": plan.PROFILE_KIND, "version": 1, "phases": phases, "points": points}))
    with pytest.raises(FormatError, match=problem):
        plan.main(["--profile", str(profile)])
    csv_file = tmp_path / "clocks.csv"
    csv_file.write_text("phase,clock,time_s,energy_j\n,default,0.3,100\n")
    with pytest.raises(FormatError, match="a phase has an empty name"):
        plan.main(["--profile", str(csv_file)])


def test_a_run_naming_a_phase_twice_is_left_out(tmp_path) -> None:
    for clock in (None, 1410):
        write_attributed_run(tmp_path, f"sm-{clock or 'default'}", clock, {"forward": (0.3, 100.0)})
    path = tmp_path / "sm-1410" / "run_record.json"
    data = json.loads(path.read_text())
    rows = data["attribution"]["estimators"]["fit"]["rows"]
    rows.append(dict(rows[0]))
    path.write_text(json.dumps(data))
    assert plan.profile_from_records([tmp_path], "fit").excluded == ["run sm-1410: phase(s) forward listed twice"]


def test_an_unknown_method_is_refused_with_the_choices(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        plan.main(["--method", "bogus", str(tmp_path)])
    assert ended.value.code == 2 and "invalid choice: 'bogus' (choose from 'fit', 'replay')" in capsys.readouterr().err


def _attribution_of(path) -> tuple[dict, dict]:
    data = json.loads(path.read_text())
    return data, data["attribution"]


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda block: block["estimators"]["fit"].update(closure={"status": "misfit", "held_out": []}),
     "its attribution's closure is MISFIT (its phases do not add up to the energy measured"),
    (lambda block: block["estimators"]["fit"]["rows"][0].update(energy_per_step_j=1e-12, mean_power_w=1e-11),
     "figures rejected: phase forward: mean power per device 3.33e-12 W is below 1 W per device, less than any "
     "device draws"),
    (lambda block: block.update(idle_power_w_per_device=1e-9),
     "figures rejected: idle_power_w_per_device 1e-09 W is below 1 W per device"),
], ids=["misfit closure", "1e-12 J phase", "1e-9 W idle"])
def test_plan_leaves_out_an_attribution_that_cannot_be_planned_on(tmp_path, capsys, damage, reason) -> None:
    """Issue 61: `plan` planned on an attribution its own closure marks MISFIT, on a phase of 1e-12 J ("-15.50 %"),
    and took an idle power of 1e-9 W."""
    for clock in (None, 1410, 1110):
        write_attributed_run(tmp_path, f"sm-{clock or 'default'}", clock, {p: KNOWN[p][clock] for p in STEP_PHASES})
    path = tmp_path / "sm-1110" / "run_record.json"
    data, block = _attribution_of(path)
    damage(block)
    path.write_text(json.dumps(data))
    assert joulebench_main(["plan", str(tmp_path), "--json", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert f"left out: run sm-1110: {reason}" in " ".join(out.split()), out
    assert 1110 not in json.loads((tmp_path / "plan.json").read_text())["plan"]["clocks"]


def test_attribute_refuses_an_idle_power_no_device_draws(tmp_path, capsys) -> None:
    write_attributed_run(tmp_path, "run", None, {p: KNOWN[p][None] for p in STEP_PHASES})
    assert joulebench_main(["attribute", str(tmp_path / "run"), "--idle-power-w", "1e-9", "--no-write"]) == 64
    assert "--idle-power-w 1e-09 W is below 1 W per device, less than any device draws while powered" in \
        capsys.readouterr().err
