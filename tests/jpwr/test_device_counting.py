"""Each device counted once, and devices that vanish: samplers on the replayed H100 trace (fake pynvml only).

Two samplers with distinct node names over the same fake GPUs are what two `jpwr serve` on one host
produce; the real-process version (two `jpwr serve`, two ranks) is benchmarks/device_counting.py,
run on the CPU in tests/benchmarks/test_device_counting.py and on a GPU by the lead.
"""

from __future__ import annotations

import pytest
import sysfs_trees

from jpwr.backends import create_backend
from jpwr.channel import Mark
from jpwr.clock import VirtualClock
from jpwr.meter import combine_energies
from jpwr.node import boot_id
from jpwr.sampler import Sampler, open_backends
from tests.jpwr.synthetic import NS
from tests.jpwr.test_sampler_replay import _dense_counter_energy

WINDOW = (4.0, 9.0)  # seconds of the trace: idle until 3 s, the 700 W matmul from 3 to 11 s


def _samplers(fake_pynvml, trace_dir, tmp_path, nodes, devices=1, faults=None):
    clock = VirtualClock()
    replay = fake_pynvml.configure(trace_dir, clock, devices=devices, faults=faults, origin_ns=0)
    samplers = []
    for node in nodes:
        backends, discoveries = open_backends(["nvml"], clock)
        samplers.append(Sampler(backends, discoveries, tmp_path, 0.1, 1.0, clock=clock, node=node,
                                background=False).start(measure_costs=False))
    return replay, clock, samplers


def _window(samplers, clock, name, t0, t1):
    tick = 0
    for until, edge in ((t0, "begin"), (t1, "end")):
        while clock.monotonic_ns() < until * NS:
            for sampler in samplers:
                sampler.poll_once(tick)
            tick += 1
            clock.set_ns(clock.monotonic_ns() + 100_000_000 - clock.monotonic_ns() % 100_000_000)
        for sampler in samplers:
            sampler.add_mark(Mark(name, edge, 0 if edge == "begin" else 10, clock.monotonic_ns()))
    return [sampler.window_energies([name]) for sampler in samplers]


def test_a_gpu_seen_by_two_samplers_is_counted_once_and_the_nodes_are_named(fake_pynvml, h100_trace_dir, tmp_path):
    replay, clock, samplers = _samplers(fake_pynvml, h100_trace_dir, tmp_path, ("n1", "n2"))
    per_node = _window(samplers, clock, "steady", *WINDOW)
    single = per_node[0]["steady"]
    combined = combine_energies(per_node)["steady"]
    assert combined.devices == 1 and combined.energy_j == pytest.approx(single.energy_j)
    assert combined.error_bound_j == pytest.approx(single.error_bound_j)
    overlap = [w for w in combined.warnings if "counted once" in w]
    assert len(overlap) == 1 and "n1, n2" in overlap[0] and "Fix:" in overlap[0]
    begin, end = (m.t_ns for m in samplers[0].marks)
    assert abs(combined.energy_j - _dense_counter_energy(replay, begin, end)) <= combined.error_bound_j


def test_a_node_that_selects_no_gpu_says_it_metered_nothing_and_is_skipped(fake_pynvml, h100_trace_dir, tmp_path,
                                                                           monkeypatch):
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock, origin_ns=0)
    samplers = []
    for node, visible in (("n1", "0"), ("n2", "")):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        backends, discoveries = open_backends(["nvml"], clock)  # an explicit method, yet no error for n2
        samplers.append(Sampler(backends, discoveries, tmp_path, 0.1, 1.0, clock=clock, node=node,
                                background=False).start(measure_costs=False))
    per_node = _window(samplers, clock, "steady", *WINDOW)
    empty = per_node[1]["steady"]
    assert empty.metered_nothing and empty.energy_j is None and empty.devices == 0
    assert "node n2 metered no accelerators" in empty.unavailable_reason and "CUDA_VISIBLE_DEVICES=''" in (
        empty.unavailable_reason)
    combined = combine_energies(per_node)["steady"]
    assert combined.energy_j == pytest.approx(per_node[0]["steady"].energy_j) and combined.devices == 1
    assert combined.nodes == ["n1", "n2"] and any("n2 metered no accelerators" in w for w in combined.warnings)
    nothing = combine_energies([per_node[1]])["steady"]
    assert nothing.energy_j is None and nothing.metered_nothing


def test_a_gpu_that_vanishes_mid_window_is_named_and_its_gap_is_in_the_bound(fake_pynvml, h100_trace_dir, tmp_path):
    lost = fake_pynvml.NVML_ERROR_GPU_IS_LOST
    calls = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage")
    faults = {1: fake_pynvml.Faults(fails=tuple(fake_pynvml.Fail(c, lost, from_ns=6 * NS) for c in calls))}
    replay, clock, (sampler,) = _samplers(fake_pynvml, h100_trace_dir, tmp_path, ("n1",), devices=2, faults=faults)
    during = _window([sampler], clock, "during", *WINDOW)[0]["during"]
    after = _window([sampler], clock, "after", 10.0, 12.0)[0]["after"]
    healthy, gone = during.per_device
    assert healthy.coverage == pytest.approx(1.0) and gone.coverage < 0.5
    assert any("stopped answering 2.0" in w and "NVML_ERROR_GPU_IS_LOST" in w for w in gone.warnings)
    # below the coverage threshold the window's energy is withheld (issue 22), the device and error named
    assert not during.trusted and during.energy_j is None and gone.domain in during.untrusted_reason
    assert "NVML_ERROR_GPU_IS_LOST" in during.untrusted_reason
    begin, end = (m.t_ns for m in sampler.marks if m.name == "during")
    truth = 2 * _dense_counter_energy(replay, begin, end)  # both fake GPUs replay the same trace
    assert during.partial_energy_j < truth
    sampler.min_coverage = 0.3  # allowed to count it, the gap is charged to the bound
    counted = sampler.window_energies(["during"])["during"]
    assert counted.trusted and abs(counted.energy_j - truth) <= counted.error_bound_j
    assert after.energy_j is None and not after.trusted and gone.domain in after.unavailable_reason
    assert "NVML_ERROR_GPU_IS_LOST" in after.unavailable_reason


def test_a_rapl_zone_seen_by_two_node_identities_of_one_host_is_counted_once(tmp_path):
    """Node identities (JPWR_NODE_NAME, a local Slurm's test nodes) on one host read the same powercap: its zones
    carry the host's boot id as their UUID, so the sum counts each once."""
    root = sysfs_trees.powercap(tmp_path / "sys", {"intel-rapl:0": ("package-0", 1_000_000, 2**40)})
    clock = VirtualClock()
    samplers = []
    for node in ("host-n0", "host-n1"):
        backend = create_backend("rapl", clock, sysfs_root=root)
        samplers.append(Sampler([backend], [backend.discover()], tmp_path / node, 0.1, 1.0, clock=clock, node=node,
                                background=False).start(measure_costs=False))
    per_node = _window(samplers, clock, "steady", 0.5, 2.0)
    assert [p["steady"].devices for p in per_node] == [1, 1]
    combined = combine_energies(per_node)["steady"]
    assert combined.devices == 1 and combined.energy_j == pytest.approx(per_node[0]["steady"].energy_j)
    overlap = [w for w in combined.warnings if "counted once" in w]
    assert len(overlap) == 1 and f"rapl:{boot_id()}:intel-rapl:0" in overlap[0] and "host-n0, host-n1" in overlap[0]
