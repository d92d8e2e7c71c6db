"""Entry point: `python -m llm_inference {run,validate} ...`."""

from joulebench.process_exit import run_driver

run_driver("llm_inference", "inference")
