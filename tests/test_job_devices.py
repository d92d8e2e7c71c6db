"""The job's devices are the metered devices (issue 43): a fake NVML node of 4 GPUs, a job bound to 2 of them.

The idle two are out of the headline; a whole-node request meters them on their own line over the same windows;
each GPU's energy, mean power and utilisation reach the record; the hardware block names the interconnect.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from joulebench.record import RunRecord, per_device_figures, steady_metrics
from jpwr import MethodUnavailableError, Window
from jpwr.channel import Mark
from jpwr.clock import VirtualClock
from jpwr.devices import gpu_interconnect
from jpwr.energy import combine_energies
from jpwr.sampler import Sampler, open_backends, summarize_trace
from tests.jpwr.synthetic import NS

WINDOW = (4.0, 9.0)  # seconds of the replayed H100 trace: the 700 W matmul runs from 3 to 11 s
NODE_GPUS = 4


def _sampler(fake_pynvml, trace_dir, tmp_path, monkeypatch, bound: str, whole_node: bool, node: str = "n1",
             clock: VirtualClock | None = None):
    """A sampler on a fake 4-GPU node for a job bound to `bound` (CUDA_VISIBLE_DEVICES, PCI order)."""
    if clock is None:
        clock = VirtualClock()
        fake_pynvml.configure(trace_dir, clock, devices=NODE_GPUS, origin_ns=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", bound)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    backends, discoveries = open_backends(["nvml"], clock, whole_node=whole_node)
    sampler = Sampler(backends, discoveries, tmp_path / node, 0.1, 1.0, clock=clock, node=node, background=False)
    return sampler.start(measure_costs=False), clock


def _steady(samplers, clock):
    """Poll every sampler over WINDOW and mark it as the steady window on each; their energies of it."""
    tick = 0
    for until, edge in ((WINDOW[0], "begin"), (WINDOW[1], "end")):
        while clock.monotonic_ns() < until * NS:
            for sampler in samplers:
                sampler.poll_once(tick)
            tick += 1
            clock.set_ns(clock.monotonic_ns() + 100_000_000 - clock.monotonic_ns() % 100_000_000)
        for sampler in samplers:
            sampler.add_mark(Mark("steady", edge, 0 if edge == "begin" else 10, clock.monotonic_ns(),
                                  work={"tokens": 1000.0} if edge == "end" else {}))
    return [sampler.window_energies(["steady"])["steady"] for sampler in samplers]


def test_a_job_bound_to_two_of_four_gpus_meters_those_two_and_the_whole_node_line_the_others(
        fake_pynvml, h100_trace_dir, tmp_path, monkeypatch):
    sampler, clock = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "1,2", whole_node=True)
    (energy,) = _steady([sampler], clock)
    assert energy.devices == 2 and sorted(d.index for d in energy.per_device) == [1, 2]
    assert energy.energy_j == pytest.approx(sum(d.energy_j for d in energy.per_device))
    assert sorted(d.index for d in energy.outside_job) == [0, 3]
    outside = sum(d.energy_j for d in energy.outside_job)
    assert energy.outside_job_energy_j == pytest.approx(outside) and outside > 0
    assert energy.outside_job_line == f"not used by the job: 2 devices, {outside:.6g} J"
    assert not any("metered devices" in w for w in energy.warnings)
    # the same windows offline (the node summary written at stop), the idle two still on their own line
    offline = summarize_trace(sampler.trace(), 0.1).windows["steady"].energy
    assert offline.energy_j == pytest.approx(energy.energy_j) and offline.devices == 2
    assert offline.outside_job_energy_j == pytest.approx(outside)
    sampler.stop()


def test_without_the_whole_node_request_the_other_gpus_are_not_metered_at_all(
        fake_pynvml, h100_trace_dir, tmp_path, monkeypatch):
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock, devices=NODE_GPUS, origin_ns=0)
    job_only, _ = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "1,2", False, "n1", clock)
    whole, _ = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "1,2", True, "n2", clock)
    assert {d.index for d in job_only.domains} == {1, 2} and {d.index for d in whole.domains} == {0, 1, 2, 3}
    plain, with_line = _steady([job_only, whole], clock)
    assert plain.outside_job == [] and plain.outside_job_line is None
    assert plain.to_dict()["outside_job_energy_j"] is None
    assert plain.devices == with_line.devices == 2
    # the headline is the job's either way: the two samplers' reads differ in time, within their bounds
    assert abs(plain.energy_j - with_line.energy_j) <= plain.error_bound_j + with_line.error_bound_j
    for sampler in (job_only, whole):
        sampler.stop()


def test_each_gpu_carries_its_mean_utilisation_over_the_window(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch):
    sampler, clock = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "0,3", whole_node=False)
    (energy,) = _steady([sampler], clock)
    begin, end = (m.t_ns for m in sampler.marks)
    for device in energy.per_device:
        samples = [m.value for m in sampler.metrics
                   if m.domain_id == device.domain and m.name == "utilization_gpu" and begin <= m.t_ns <= end]
        assert samples and device.utilization_gpu == pytest.approx(sum(samples) / len(samples))
        assert device.mean_power_w == pytest.approx(device.energy_j / ((end - begin) / 1e9))
    sampler.stop()


def test_combined_nodes_leave_out_of_the_whole_node_line_what_another_node_s_job_used(
        fake_pynvml, h100_trace_dir, tmp_path, monkeypatch):
    """Two node identities on one host, each bound to two GPUs, each asked for the whole node: every GPU is some
    job's, so the combined line is empty and the headline counts each GPU once."""
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock, devices=NODE_GPUS, origin_ns=0)
    first, _ = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "0,1", True, "n1", clock)
    second, _ = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "2", True, "n2", clock)
    per_node = _steady([first, second], clock)
    combined = combine_energies([{"steady": e} for e in per_node])["steady"]
    assert combined.devices == 3 and sorted(d.index for d in combined.outside_job) == [3]
    assert combined.outside_job_energy_j == pytest.approx(per_node[0].outside_job[-1].energy_j)
    for sampler in (first, second):
        sampler.stop()


def test_a_binding_that_names_no_gpu_of_the_node_is_refused_also_on_a_whole_node_request(
        fake_pynvml, h100_trace_dir, monkeypatch):
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock, devices=NODE_GPUS, origin_ns=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(MethodUnavailableError, match="matches no single GPU of 4"):
        open_backends(["nvml"], clock, whole_node=True)


def test_the_record_gives_each_gpu_s_energy_power_and_utilisation_and_the_whole_node_line(
        fake_pynvml, h100_trace_dir, tmp_path, monkeypatch):
    sampler, clock = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "1,2", whole_node=True)
    (energy,) = _steady([sampler], clock)
    begin, end = (m.t_ns for m in sampler.marks)
    window = Window("steady", 0, 10, begin, end, {"tokens": 1000.0}, energy)
    metrics = steady_metrics(window, "tokens", devices=2)
    record = RunRecord("llm_training", "r1", windows=[window], metrics=metrics)
    assert metrics["energy_devices"] == 2 and metrics["energy_warning"] is None
    rows = record.metrics["per_device"]
    assert [(r["index"], r["node"]) for r in rows] == [(1, "n1"), (2, "n1")]
    for row, device in zip(rows, energy.per_device, strict=True):
        assert (row["energy_j"], row["mean_power_w"], row["utilization_gpu"]) == (
            device.energy_j, device.mean_power_w, device.utilization_gpu)
        assert row["uuid"] == device.uuid
    assert metrics["outside_job_devices"] == 2
    assert metrics["outside_job_energy_j"] == pytest.approx(energy.outside_job_energy_j)
    assert per_device_figures(None) == []  # no window energy: no rows, never rows of zeros
    sampler.stop()


@pytest.mark.parametrize("links, expected", [(0, "PCIe"), (18, "NVLink")])
def test_the_interconnect_is_read_from_nvml(fake_pynvml, h100_trace_dir, links, expected):
    fake_pynvml.configure(h100_trace_dir, devices=NODE_GPUS, nvlink_links=links)
    found = gpu_interconnect()
    assert found.name == expected and f"{NODE_GPUS} GPU" in found.detail


def test_one_gpu_has_no_interconnect_to_name(fake_pynvml, h100_trace_dir):
    fake_pynvml.configure(h100_trace_dir, devices=1, nvlink_links=0)  # an SXM card alone in a VM: no active link
    assert gpu_interconnect().name == "none"


def test_the_interconnect_is_unknown_without_nvml(fake_pynvml):
    found = gpu_interconnect()  # unconfigured fake: no NVIDIA driver
    assert found.name == "unknown" and "NVML" in found.detail


def test_jpwr_prints_the_whole_node_line_beside_the_job_s_window(fake_env, h100_trace_dir, tmp_path):
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES=str(NODE_GPUS),
                   CUDA_VISIBLE_DEVICES="0,1", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    command = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--whole-node", "--out", str(tmp_path), "--",
               sys.executable, "-c", "import time; time.sleep(1.5)"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    window = next(line for line in proc.stderr.splitlines() if line.startswith("jpwr: window command: ")
                  and " J (" in line)
    assert "on 2 device(s)" in window
    assert "jpwr: window command: not used by the job: 2 devices, " in proc.stderr


def test_the_hardware_block_names_the_interconnect_of_a_gpu_run_only(fake_pynvml, h100_trace_dir):
    from joulebench.node_facts import gpu_node_facts

    fake_pynvml.configure(h100_trace_dir, devices=2, nvlink_links=18)
    facts = gpu_node_facts("cuda")
    assert facts["gpu_interconnect"] == "NVLink" and "2 of 2 GPU(s)" in facts["gpu_interconnect_detail"]
    assert gpu_node_facts("cpu") == {}


def test_a_node_bound_to_no_gpu_meters_nothing_and_its_whole_node_line_survives_the_combination(
        fake_pynvml, h100_trace_dir, tmp_path, monkeypatch):
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock, devices=NODE_GPUS, origin_ns=0)
    busy, _ = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "0", False, "n1", clock)
    empty, _ = _sampler(fake_pynvml, h100_trace_dir, tmp_path, monkeypatch, "", True, "n2", clock)
    per_node = _steady([busy, empty], clock)
    assert per_node[1].metered_nothing and per_node[1].energy_j is None and len(per_node[1].outside_job) == NODE_GPUS
    combined = combine_energies([{"steady": e} for e in per_node])["steady"]
    assert combined.devices == 1 and combined.energy_j == pytest.approx(per_node[0].energy_j)
    assert sorted(d.index for d in combined.outside_job) == [1, 2, 3]  # GPU 0 is n1's job's
    for sampler in (busy, empty):
        sampler.stop()
