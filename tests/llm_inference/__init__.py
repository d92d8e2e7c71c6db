"""Tests of the LLM inference driver: real transformers generation on CPU; fake GPUs only at pynvml."""
