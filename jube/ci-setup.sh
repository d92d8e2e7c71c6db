#!/bin/sh
# CI set-up for the JUBE workflow tests (tests/jube): Debian's JUBE 2.5.1, Slurm 22.05 + munge for the local
# cluster (jube/slurm-local.sh, started by the tests themselves), xmllint for the DTD check; and Debian's
# Prometheus server, which tests/jpwr/test_prometheus.py starts on 127.0.0.1 to scrape `jpwr --metrics-port`
# (16 s to install). Run as root.
# Nothing is started here; Debian's policy-rc.d keeps the daemons from starting on install.
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends jube slurmctld slurmd slurm-client munge libxml2-utils prometheus
