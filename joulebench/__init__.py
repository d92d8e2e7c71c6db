"""joulebench: what every benchmark driver shares, and (in joulebench.analysis) what reads their results.

The core (this package, outside `analysis`) holds the run record and its metrics, the launch
environment, run control, torch device facts, the peak table and the drivers' policy on top of the
meter (steady-window sizing, the shared phase names and their replay, command-line types, the error
boundary naming the extras); it builds on the meter `jpwr`, through its public names only.
Drivers import the core, never `joulebench.analysis`. See docs/architecture.md.
"""

from jpwr import __version__

__all__ = ["__version__"]
