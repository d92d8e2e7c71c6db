"""Entry point: `python -m llm_inference {run,validate} ...`."""

from joulebench.process_exit import exit_after_run
from llm_inference.cli import main

exit_after_run(main())
