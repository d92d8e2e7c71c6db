"""LLM inference time-and-energy benchmark (ML.ENERGY-style): static batches and an open-loop serving load.

Its own compact model code runs the static engine (static KV cache, CUDA-graph decode steps) and the
continuous-batching engine of the load; Hugging Face transformers generate is the `hf` baseline engine, and the
load also drives an HTTP inference server (vLLM, ...) as its target. See docs/llm_inference.md.
"""

from joulebench.tensorflow_free import tensorboard_without_tensorflow

tensorboard_without_tensorflow()  # `--log-to tensorboard` writes event files; TensorFlow itself is never needed
