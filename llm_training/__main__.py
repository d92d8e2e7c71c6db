"""Entry point: `python -m llm_training {train,validate,preprocess} ...` (also under torchrun and srun)."""

from joulebench.process_exit import run_driver

run_driver("llm_training", "llm")
