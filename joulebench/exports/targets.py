"""The `--log-to` option: which tools, each checked importable when the command line is parsed, before any work,
so that a missing extra stops the run at once with the `pip install` that fixes it."""

from __future__ import annotations

import argparse
import importlib.util
import os

# --log-to name -> (module it needs, joulebench extra that installs it)
TARGETS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}
# MLflow's local SQLite store (no MLFLOW_TRACKING_URI) needs these too; mlflow-skinny alone does not bring them
MLFLOW_STORE_MODULES = ("sqlalchemy", "alembic")


def missing_extra(name: str) -> str | None:
    """Why `name` cannot log here (its package is not installed, and the command that installs it), or None."""
    module, extra = TARGETS[name]
    if importlib.util.find_spec(module) is None:
        return f"--log-to {name} needs the {module} package: pip install 'joulebench[{extra}]'"
    if name == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
        missing = [m for m in MLFLOW_STORE_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            return (f"--log-to mlflow without MLFLOW_TRACKING_URI (a local SQLite store) needs the "
                    f"{' and '.join(missing)} package(s): pip install 'joulebench[{extra}]'")
    return None


def log_to(text: str) -> tuple[str, ...]:
    """argparse type of --log-to: a comma list of known tools, each installed."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown --log-to target {unknown[0] if unknown else text!r}: "
                                         f"use a comma list of {', '.join(TARGETS)}")
    problems = [p for p in map(missing_extra, names) if p]
    if problems:
        raise argparse.ArgumentTypeError("; ".join(problems))
    return names


def add_log_to(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The drivers' shared --log-to option."""
    parser.add_argument("--log-to", type=log_to, default=(), metavar="TOOLS",
                        help="also log power, energy per log interval and the window figures (each with its method "
                             "and bound) to these tools: a comma list of tensorboard, mlflow, wandb (W&B offline "
                             "unless WANDB_MODE says otherwise); files under the output directory (docs/exports.md)")
