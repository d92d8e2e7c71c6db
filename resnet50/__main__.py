"""Entry point of `python -m resnet50`."""

from joulebench.process_exit import exit_after_run
from resnet50.cli import main

exit_after_run(main())
