"""Method names (incl. jpwr 0.0.10 aliases) and that every backend degrades to 'unavailable' without hardware."""

from __future__ import annotations

import pytest

from jpwr.backends import BACKEND_NAMES, create_backend, parse_methods
from jpwr.clock import VirtualClock
from jpwr.errors import ExitCode, ValidationError


@pytest.mark.parametrize("spec", [None, "", "auto", " AUTO "])
def test_auto_means_none(spec: str | None) -> None:
    assert parse_methods(spec) is None


def test_aliases_map_to_canonical_names_in_order_without_duplicates() -> None:
    assert parse_methods("pynvml,rocm,gh,gc") == ["nvml", "amdsmi", "hwmon_gh", "gcipuinfo"]
    assert parse_methods("nvml, pynvml ,rapl,NVML") == ["nvml", "rapl"]


def test_unknown_method_names_the_value_and_lists_valid_ones() -> None:
    with pytest.raises(ValidationError) as info:
        parse_methods("nvml,nvsmi")
    message = str(info.value)
    assert "'nvsmi'" in message
    assert all(name in message for name in BACKEND_NAMES)
    assert "pynvml=nvml" in message
    assert info.value.exit_code == ExitCode.USAGE


def test_empty_entry_is_rejected() -> None:
    with pytest.raises(ValidationError, match="empty entry"):
        parse_methods("nvml,,rapl")


@pytest.mark.parametrize("spec", ["replay:tests/data/h100_trace,nvml", "rapl, replay:t", "replay:a,replay:b"])
def test_a_replayed_trace_is_never_combined_with_another_method(spec: str) -> None:
    with pytest.raises(ValidationError, match="combines a replayed trace with another method") as info:
        parse_methods(spec)
    assert "pass replay:TRACE_DIR alone" in str(info.value)
    assert parse_methods("replay:tests/data/h100_trace, replay:tests/data/h100_trace") == [
        "replay:tests/data/h100_trace"]


@pytest.mark.parametrize("name", [*BACKEND_NAMES, "pynvml", "rocm", "gh", "gc"])
def test_every_backend_reports_unavailable_without_hardware(name: str, tmp_path, fake_pynvml, fake_amdsmi,
                                                            fake_gcipuinfo) -> None:
    backend = create_backend(name, VirtualClock(), sysfs_root=tmp_path)
    disc = backend.discover()
    assert disc.sensors == [] and disc.domains == []
    assert disc.unavailable and all(line.startswith(f"{backend.name}: unavailable: ") for line in disc.unavailable)
    assert backend.read([]) == []
    backend.close()
