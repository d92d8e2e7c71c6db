"""Entry point: `python -m llm_training {train,validate,preprocess} ...` (also under torchrun and srun)."""

import sys

from llm_training.cli import main

sys.exit(main())
