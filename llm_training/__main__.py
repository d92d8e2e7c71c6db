"""Entry point: `python -m llm_training {train,validate,preprocess} ...` (also under torchrun and srun)."""

from joulebench.process_exit import exit_after_run
from llm_training.cli import main

exit_after_run(main())
