"""The meter's wire and summary forms (TypedDicts in jpwr) name exactly the keys their to_dict writes, in order, so
that the types cannot drift from what a sampler sends, a trace keeps and a summary holds."""

from __future__ import annotations

from typing import Any

import pytest

from jpwr.channel import Mark, MarkDict
from jpwr.live import DeviceLive, DeviceLiveDict, NodeLive, NodeLiveDict
from jpwr.phases import PhaseBatch, PhaseBatchDict, PhaseRow, phase_summary

DEVICE = DeviceLive("gpu0", 0.1, 250.0, 240.0, 260.0, 1.0, 60.0, 59.0, 61.0)
BATCH = PhaseBatch("steady", 1, 1, "host", ("forward", "backward"), (0, 1, 0), (10, 20, 30), (15, 28, 33))


@pytest.mark.parametrize(("written", "kind"), [
    (Mark("steady", "begin", 3, 100, 1, 1, (("tokens", 8.0),)).to_dict(), MarkDict),
    (DEVICE.to_dict(), DeviceLiveDict), (NodeLive("n1", 2.0, (DEVICE,)).to_dict(), NodeLiveDict),
    (BATCH.to_dict(), PhaseBatchDict), (phase_summary([BATCH])[0], PhaseRow)],
    ids=lambda x: getattr(x, "__name__", ""))
def test_a_wire_form_writes_the_keys_its_type_declares(written: dict[str, Any], kind: Any) -> None:
    assert sorted(written) == sorted(kind.__annotations__)


def test_the_phase_summary_counts_each_rank_s_phases_in_order() -> None:
    rows = phase_summary([BATCH])
    assert [(r["phase"], r["intervals"], round(r["seconds"] * 1e9)) for r in rows] == [("backward", 1, 8),
                                                                                         ("forward", 2, 8)]
    assert all(r["complete"] for r in rows)
