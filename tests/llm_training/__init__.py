"""Tests of the Megatron GPT driver: real megatron-core on CPU over gloo; fake GPUs only at pynvml."""
