"""The analytic FLOP count against the real models: torch's FLOP counter and Keras' layer shapes."""

from __future__ import annotations

import pytest

from resnet50.flops import resnet50_flops


@pytest.mark.parametrize("size", [224, 64])
def test_v15_matches_torch_flop_counter_on_torchvision_resnet50(size: int) -> None:
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from torch.utils.flop_counter import FlopCounterMode

    model = torchvision.models.resnet50(weights=None).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, 3, size, size))
    assert resnet50_flops("v1.5", size).forward == counter.get_total_flops()


def test_v1_matches_keras_resnet50_layer_shapes() -> None:
    keras = pytest.importorskip("keras")
    size = 96
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classifier_activation=None)
    macs = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _batch, height, width, channels = layer.output.shape
            macs += height * width * channels * layer.kernel_size[0] * layer.kernel_size[1] * layer.input.shape[-1]
        elif isinstance(layer, keras.layers.Dense):
            macs += layer.input.shape[-1] * layer.units
    assert resnet50_flops("v1", size).forward == 2 * macs


def test_variants_differ_and_training_is_three_forward() -> None:
    v1, v15 = resnet50_flops("v1", 224), resnet50_flops("v1.5", 224)
    assert v1.forward < v15.forward  # v1.5's stride moved to the 3x3 conv: its 1x1 convs run at full resolution
    assert v15.forward == pytest.approx(8.18e9, rel=1e-3)  # torchvision's documented 4.09 GMAC
    assert v1.training == 3 * v1.forward and v15.training == 3 * v15.forward
    assert "3 x forward" in v1.to_dict()["flops_convention"]
    with pytest.raises(ValueError, match="v2"):
        resnet50_flops("v2", 224)
