"""`--objective speed|energy|edp`: how the static engine chooses its decode variant per batch shape, and where the
option is refused (nothing to rank, or a pinned variant that overrides the choice)."""

from __future__ import annotations

import pytest

from jpwr.errors import ExitCode
from llm_inference.cli import main
from llm_inference.decode_choice import DEFAULT_OBJECTIVE, choose, energy_per_step_j, meter_probe

# H100, llama-1b chat at batch 1 (issue 46, docs/BENCHMARKS.md): ms per token and J per token of each variant
LLAMA_1B = {"default": (1.274, 0.662), "coordinate-descent": (1.420, 0.525)}
LLAMA_8B = {"default": (5.851, 3.95), "coordinate-descent": (6.309, 2.85)}


def as_inputs(figures: dict[str, tuple[float, float]]) -> tuple[dict[str, float], dict[str, float | None]]:
    """Step times and the mean powers that give those energies per step (J = ms × W / 1000)."""
    return ({name: ms for name, (ms, _) in figures.items()},
            {name: joules / ms * 1e3 for name, (ms, joules) in figures.items()})


@pytest.mark.parametrize("figures", [LLAMA_1B, LLAMA_8B], ids=["llama-1b", "llama-8b"])
def test_each_objective_picks_its_variant_from_the_measured_trade_off(figures):
    step_ms, power_w = as_inputs(figures)
    fastest = min(figures, key=lambda n: figures[n][0])
    cheapest = min(figures, key=lambda n: figures[n][1])
    by_edp = min(figures, key=lambda n: figures[n][0] * figures[n][1])
    assert fastest != cheapest  # the trade-off the option exists for
    assert choose(step_ms, power_w, "speed").variant == fastest
    energy = choose(step_ms, power_w, "energy")
    assert (energy.variant, energy.basis) == (cheapest, "energy")
    assert energy_per_step_j(step_ms[cheapest], energy.power_w[cheapest]) == pytest.approx(figures[cheapest][1])
    assert choose(step_ms, power_w, "edp").variant == by_edp
    assert DEFAULT_OBJECTIVE == "speed"  # the default stays the choice made before the option existed


def test_without_a_sensor_energy_falls_back_to_speed_and_says_so():
    step_ms, _ = as_inputs(LLAMA_1B)
    choice = choose(step_ms, {}, "energy")
    assert choice.variant == "default" and choice.power_w == {"default": None, "coordinate-descent": None}
    assert choice.basis.startswith("speed (energy needs each variant's power; n/a for default, coordinate-descent")
    with pytest.raises(ValueError, match="objective 'cheap'"):
        choose(step_ms, {}, "cheap")


class Live:
    def __init__(self, watts: float | None) -> None:
        self.power_w = watts


class Meter:
    def __init__(self, sampler: bool, watts: float | None) -> None:
        self.has_sampler, self.asked, self.watts = sampler, [], watts

    def live(self, span_s: float, timeout_s: float = 10.0) -> Live:
        self.asked.append(span_s)
        return Live(self.watts)


def test_the_probe_reads_the_meter_s_recent_mean_power_and_is_absent_without_a_sampler():
    meter = Meter(True, 512.5)
    probe = meter_probe(meter)
    assert probe is not None and probe(1.0) == 512.5 and meter.asked == [1.0]
    assert meter_probe(Meter(False, 512.5)) is None


TINY = ["validate", "--preset", "tiny", "--device", "cpu"]


@pytest.mark.parametrize(("args", "expected"), [
    (["--engine", "hf", "--objective", "energy"], "--objective energy ranks the static engine's compiled decode"),
    (["--objective", "edp", "--decode-tuning", "coordinate-descent"],
     "--objective edp and --decode-tuning coordinate-descent conflict"),
])
def test_objective_is_refused_where_it_would_choose_nothing(args, expected, capsys):
    assert main([*TINY, *args]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert expected in err and "Fix:" in err


def test_objective_with_auto_tuning_is_taken_and_load_refuses_it(capsys):
    assert main([*TINY, "--objective", "energy", "--decode-tuning", "auto", "--external-sampler"]) == ExitCode.OK
    capsys.readouterr()
    assert main(["validate-load", "--preset", "tiny", "--device", "cpu", "--rate", "2", "--objective", "energy"]
                ) == ExitCode.USAGE
    assert "`load` runs the continuous engine's default variant or a server target" in capsys.readouterr().err


def test_the_run_s_objective_reaches_the_engine_and_its_record_detail():
    import torch

    from llm_inference.cli import build_parser
    from llm_inference.config import resolve
    from llm_inference.presets import PRESETS
    from llm_inference.runner import make_engine

    def engine_for(*extra: str):
        cfg = resolve(build_parser().parse_args(["run", "--preset", "tiny", "--device", "cpu", *extra]))
        return cfg, make_engine(cfg, PRESETS["tiny"], "fp32", torch.device("cpu"), None)

    cfg, engine = engine_for("--objective", "edp")
    assert cfg.to_dict()["objective"] == "edp" and engine.describe()["decode_objective"] == "edp"
    cfg, engine = engine_for()
    assert cfg.to_dict()["objective"] is None  # not given: the record says so; the engine runs the default
    assert engine.describe()["decode_objective"] == DEFAULT_OBJECTIVE and engine.power_probe is None


def test_an_energy_objective_without_a_sampler_is_refused_at_the_run_s_start(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("JPWR_ADDR", raising=False)
    for objective in ("energy", "edp"):
        assert main(["run", "--preset", "tiny", "--device", "cpu", "--objective", objective, "--out-dir",
                     str(tmp_path / objective)]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert f"--objective {objective} ranks the decode variants by their measured power" in err
        assert "Fix: pass --energy-methods" in err and not (tmp_path / objective).exists()  # refused before any work


def test_validate_refuses_an_energy_objective_without_a_sampler_as_the_run_does(capsys, monkeypatch):
    """Issue 61's case: `validate --objective energy` without a meter said OK, then the run refused it."""
    monkeypatch.delenv("JPWR_ADDR", raising=False)
    for objective in ("energy", "edp"):
        assert main([*TINY, "--objective", objective]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert f"--objective {objective} ranks the decode variants by their measured power" in err
        assert "Fix: pass --energy-methods" in err and "--external-sampler" in err
    for sampler in (["--energy-methods", "rapl"], ["--external-sampler"]):  # the run's own sampler, or jpwr's
        assert main([*TINY, "--objective", "energy", *sampler]) == ExitCode.OK
    monkeypatch.setenv("JPWR_ADDR", "/tmp/jpwr.sock")  # under `jpwr --`, as the run reads it
    assert main([*TINY, "--objective", "energy"]) == ExitCode.OK
