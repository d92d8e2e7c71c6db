"""Energy in the tools users already watch: `--log-to tensorboard,mlflow,wandb` (each an optional extra).

The loop logs energy per log interval (joulebench.exports.intervals) and the lifecycle logs the run's window
figures at the end (joulebench.exports.run), each with its method, bound and window as tags, never a bare figure.
Only global rank 0 logs. See docs/exports.md.
"""
