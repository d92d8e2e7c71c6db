"""joulebench: what every benchmark driver shares, and (in joulebench.analysis) what reads their results.

The core (this package, outside `analysis`) holds the run record and its metrics, the launch
environment, run control, torch device facts and the peak table; it builds on the meter `jpwr`.
Drivers import the core, never `joulebench.analysis`. See docs/architecture.md.
"""

from jpwr import __version__

__all__ = ["__version__"]
