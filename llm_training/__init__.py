"""Megatron GPT training benchmark on megatron-core 0.16.1 (see docs/llm_training.md)."""
