"""Tests of the ResNet-50 driver: real torch/torchvision and real TensorFlow/Keras on the CPU."""
