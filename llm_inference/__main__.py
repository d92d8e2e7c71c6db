"""Entry point: `python -m llm_inference {run,validate} ...`."""

import sys

from llm_inference.cli import main

sys.exit(main())
