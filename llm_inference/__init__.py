"""LLM inference time-and-energy benchmark (ML.ENERGY-style) on Hugging Face transformers generation."""

from joulebench.tensorflow_free import tensorboard_without_tensorflow

tensorboard_without_tensorflow()  # `--log-to tensorboard` writes event files; TensorFlow itself is never needed
