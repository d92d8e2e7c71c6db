"""jpwr: accelerator power and energy measurement, as a library and the `jpwr` command.

The meter alone: vendor backends, one sampler per node, window marks from the loop, the
counter-anchored estimator with its error bound, trace files and the node combination. It
imports nothing of the benchmarks built on it (joulebench, the drivers) and no framework at
module level. See docs/jpwr.md and docs/architecture.md.
"""

__version__ = "0.1.0"
