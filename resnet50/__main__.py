"""Entry point of `python -m resnet50`."""

from joulebench.process_exit import run_driver

run_driver("resnet50", "resnet-pytorch")
