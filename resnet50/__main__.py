"""Entry point of `python -m resnet50`."""

import sys

from resnet50.cli import main

sys.exit(main())
