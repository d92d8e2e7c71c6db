"""Which accelerators the job owns, from CUDA/ROCm/HIP visible-device variables and Slurm."""

from __future__ import annotations

import pytest

from jpwr.errors import ValidationError
from jpwr.selectors import job_devices, pci_key, selector_kind

UUID = "GPU-ef47fe23-3892-5c44-1781-2043445923f0"


def test_nothing_set_means_all_devices() -> None:
    sel = job_devices("nvidia", {})
    assert sel.selectors is None and sel.source == "all" and sel.selector_list is None


def test_cuda_indices_warn_about_cuda_vs_pci_order() -> None:
    sel = job_devices("nvidia", {"CUDA_VISIBLE_DEVICES": "2,0"})
    assert sel.selectors == ("2", "0") and sel.source == "CUDA_VISIBLE_DEVICES"
    assert sel.warnings and "CUDA_DEVICE_ORDER" in sel.warnings[0]
    assert not job_devices("nvidia", {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).warnings


def test_cuda_uuids_and_mig_ids_need_no_order_warning() -> None:
    sel = job_devices("nvidia", {"CUDA_VISIBLE_DEVICES": f"{UUID},MIG-4f1c2b7e-aaaa-bbbb-cccc-0123456789ab"})
    assert [selector_kind(s) for s in sel.selectors] == ["uuid", "mig"]
    assert sel.warnings == ()


@pytest.mark.parametrize("value", ["", "NoDevFiles"])
def test_empty_list_means_no_devices(value: str) -> None:
    assert job_devices("nvidia", {"CUDA_VISIBLE_DEVICES": value}).selectors == ()


def test_list_stops_at_first_negative_index_like_cuda() -> None:
    assert job_devices("nvidia", {"CUDA_VISIBLE_DEVICES": "1,-1,0"}).selectors == ("1",)


def test_bad_entry_names_the_variable_and_the_fix() -> None:
    with pytest.raises(ValidationError) as info:
        job_devices("nvidia", {"CUDA_VISIBLE_DEVICES": "0,gpu1"})
    assert "CUDA_VISIBLE_DEVICES" in str(info.value) and "'gpu1'" in str(info.value) and "Fix:" in str(info.value)


def test_visible_devices_beat_slurm_and_step_beats_job() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "3", "SLURM_JOB_GPUS": "2,3"}
    assert job_devices("nvidia", env).source == "CUDA_VISIBLE_DEVICES"
    del env["CUDA_VISIBLE_DEVICES"]
    assert job_devices("nvidia", env).selectors == ("3",)
    del env["SLURM_STEP_GPUS"]
    assert job_devices("nvidia", env).selectors == ("2", "3")


def test_slurm_ranges_expand() -> None:
    assert job_devices("nvidia", {"SLURM_JOB_GPUS": "0-2,5"}).selectors == ("0", "1", "2", "5")
    with pytest.raises(ValidationError, match="SLURM_JOB_GPUS"):
        job_devices("nvidia", {"SLURM_JOB_GPUS": "0,x"})


def test_amd_hip_indexes_into_rocr_list() -> None:
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "2,0"}
    sel = job_devices("amd", env)
    assert sel.selectors == ("6", "4") and sel.source == "ROCR_VISIBLE_DEVICES+HIP_VISIBLE_DEVICES"
    with pytest.raises(ValidationError, match="HIP_VISIBLE_DEVICES"):
        job_devices("amd", {"ROCR_VISIBLE_DEVICES": "4", "HIP_VISIBLE_DEVICES": "1"})


def test_amd_honours_hip_then_cuda_variable() -> None:
    assert job_devices("amd", {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}).selectors == ("1",)
    assert job_devices("amd", {"CUDA_VISIBLE_DEVICES": "3"}).selectors == ("3",)
    assert job_devices("amd", {"ROCR_VISIBLE_DEVICES": "GPU-8ab3c1d2e4f50617"}).selectors == ("GPU-8ab3c1d2e4f50617",)


def test_pci_ids_compare_in_any_domain_width() -> None:
    assert pci_key("00000000:C1:00.0") == pci_key("0000:c1:00.0") == pci_key("c1:00.0") == "0000:c1:00.0"


def test_selector_kinds_and_unknown_vendor() -> None:
    assert selector_kind("0000:41:00.0") == "pci"
    assert selector_kind("7") == "index"
    with pytest.raises(ValidationError):
        job_devices("intel", {})
