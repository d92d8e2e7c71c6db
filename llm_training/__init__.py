"""Megatron GPT training benchmark on megatron-core 0.16.1 (see docs/llm_training.md)."""

from joulebench.tensorflow_free import tensorboard_without_tensorflow

tensorboard_without_tensorflow()  # megatron-core pulls in TensorBoard, never TensorFlow itself
