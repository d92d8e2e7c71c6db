"""`python -m joulebench VERB`: the analysis commands (the package's only entry point into analysis)."""

import sys

from joulebench.analysis.cli import main

sys.exit(main())
