#!/bin/sh
# A real, small Slurm cluster on this one machine, for CI and for trying the JUBE workflows.
#
#   jube/slurm-local.sh start  [--shape 2|4]   start (idempotent); prints `export SLURM_CONF=...`
#   jube/slurm-local.sh stop   [--shape 2|4]   cancel jobs, stop slurmd/slurmctld (and munged if we started it),
#                                              remove its /etc/hosts lines and its files (also after a failed start)
#   jube/slurm-local.sh status [--shape 2|4]   exit 0 when every node is idle/allocated
#   jube/slurm-local.sh env    [--shape 2|4]   print the `export SLURM_CONF=...` line
#
# Debian's slurmctld/slurmd/munge (see docs/jube.md for the apt-get line). Several slurmd run on one
# host with `slurmd -N <node>`; each gets its own loopback address, port, spool and log. Fake GPUs are
# GRES backed by character devices, so `--gpus-per-node` is scheduled for real (nothing is isolated:
# no cgroups). Two shapes with different names, so that a workflow that runs on both relies only on
# its profile/environment:
#   shape 2: nodes n1-n2 (127.0.0.11-12), partition "debug" (default), 2 fake GPUs per node
#   shape 4: nodes c1-c4 (127.0.0.21-24), partitions "devel" (c1-c2, default) and "booster" (c1-c4)
# Everything lives under $JOULEBENCH_SLURM_BASE (default /tmp/joulebench-slurm-<shape>), which `stop` removes
# with the shape's /etc/hosts lines, so that nothing is left behind. Must run as root.
set -eu

command=${1:-}
[ $# -gt 0 ] && shift
shape=2
while [ $# -gt 0 ]; do
    case $1 in
        --shape) shape=$2; shift 2 ;;
        --shape=*) shape=${1#--shape=}; shift ;;
        *) echo "slurm-local: unknown option $1" >&2; exit 64 ;;
    esac
done

case $shape in
    2) prefix=n; first_ip=11; ctld_port=6817; node_port=6821; cluster=jbci2
       partitions="PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP" ;;
    4) prefix=c; first_ip=21; ctld_port=6917; node_port=6921; cluster=jbci4
       partitions="PartitionName=devel Nodes=c[1-2] Default=YES MaxTime=INFINITE State=UP
PartitionName=booster Nodes=c[1-4] Default=NO MaxTime=INFINITE State=UP" ;;
    *) echo "slurm-local: --shape must be 2 or 4, not '$shape'" >&2; exit 64 ;;
esac

base=${JOULEBENCH_SLURM_BASE:-/tmp/joulebench-slurm-$shape}
conf=$base/slurm.conf
nodes=$(seq 1 "$shape" | sed "s/^/$prefix/")
last_ip=$((first_ip + shape - 1))
last_port=$((node_port + shape - 1))

# Set when this script started munged; shared by both shapes: whichever cluster stops last stops munged.
munge_marker=${JOULEBENCH_SLURM_MUNGE_MARKER:-/tmp/joulebench-slurm-started-munge}

log() { echo "slurm-local: $*" >&2; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

all_idle() {
    alive "$base/run/slurmctld.pid" || return 1
    states=$(SLURM_CONF=$conf timeout 2 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
    [ "$(printf '%s\n' "$states" | grep -c .)" -eq "$shape" ] || return 1
    ! printf '%s\n' "$states" | grep -qv ' \(idle\|allocated\|mixed\|completing\)$'
}

write_config() {
    mkdir -p "$base/state" "$base/log" "$base/run" "$base/fakegpu"
    for node in $nodes; do mkdir -p "$base/spool/$node"; done
    for gpu in 0 1; do
        [ -c "$base/fakegpu/gpu$gpu" ] || mknod "$base/fakegpu/gpu$gpu" c 1 3
    done
    cat > "$conf" <<EOF
# Written by jube/slurm-local.sh (shape $shape); edits are overwritten on the next start.
ClusterName=$cluster
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$base/state
SlurmdSpoolDir=$base/spool/%n
SlurmctldPidFile=$base/run/slurmctld.pid
SlurmdPidFile=$base/run/slurmd.%n.pid
SlurmctldLogFile=$base/log/slurmctld.log
SlurmdLogFile=$base/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$base/log/jobcomp.log
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
DependencyParameters=kill_invalid_depend
SlurmdParameters=config_overrides
SlurmdTimeout=30
KillWait=5
GresTypes=gpu
NodeName=$prefix[1-$shape] NodeHostname=localhost NodeAddr=127.0.0.[$first_ip-$last_ip] Port=[$node_port-$last_port] CPUs=2 RealMemory=4000 Gres=gpu:2 State=UNKNOWN
$partitions
EOF
    echo "NodeName=$prefix[1-$shape] Name=gpu File=$base/fakegpu/gpu[0-1]" > "$base/gres.conf"
}

# Node names must resolve (MASTER_ADDR is the first node of the job); one marked line per node.
host_lines() {
    ip=$first_ip
    for node in $nodes; do
        echo "127.0.0.$ip $node # joulebench-slurm-local"
        ip=$((ip + 1))
    done
}

add_hosts() {
    host_lines | while read -r line; do
        grep -qxF "$line" /etc/hosts || echo "$line" >> /etc/hosts
    done
}

# This shape's lines only (the other shape may still run). Rewritten in place: /etc/hosts may be a bind mount.
remove_hosts() {
    ours=$(host_lines)
    printf '%s\n' "$ours" | grep -qxF -f - /etc/hosts || return 0
    kept=$(printf '%s\n' "$ours" | grep -vxF -f - /etc/hosts || true)
    printf '%s\n' "$kept" > /etc/hosts
}

# The files `start` made; the directory itself only if nothing else is in it (JOULEBENCH_SLURM_BASE may be any path).
remove_files() {
    rm -rf "$base/state" "$base/log" "$base/run" "$base/spool" "$base/fakegpu" "$conf" "$base/gres.conf"
    rmdir "$base" 2>/dev/null || true
}

start_munge() {
    munge_ok && return 0
    if [ ! -f /etc/munge/munge.key ]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0600 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$munge_marker"
    i=0
    until munge_ok; do
        i=$((i + 1)); [ $i -gt 50 ] && { log "munged did not come up"; exit 1; }
        sleep 0.1
    done
}

start() {
    if [ "$(id -u)" -ne 0 ]; then log "must run as root (slurmd, munged)"; exit 1; fi
    if all_idle; then
        log "already running ($conf)"
        echo "export SLURM_CONF=$conf"
        return 0
    fi
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
        log "Slurm/munge missing: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
        exit 1
    fi
    mkdir -p "$base/run"
    write_config
    add_hosts
    start_munge
    if ! alive "$base/run/slurmctld.pid"; then
        rm -rf "$base/state"/* "$base/spool"/*/*  # clean slate: no stale DRAIN, job ids restart at 1
        slurmctld -f "$conf"
    fi
    for node in $nodes; do
        alive "$base/run/slurmd.$node.pid" || slurmd -f "$conf" -N "$node"
    done
    i=0
    until all_idle; do
        i=$((i + 1))
        if [ $i -gt 150 ] || ! alive "$base/run/slurmctld.pid"; then
            log "cluster did not become idle; see $base/log/"
            SLURM_CONF=$conf timeout 2 sinfo -N >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    log "running: $shape nodes ($(echo $nodes)), config $conf"
    echo "export SLURM_CONF=$conf"
}

stop() {
    if alive "$base/run/slurmctld.pid"; then
        jobs=$(SLURM_CONF=$conf timeout 5 squeue -h -o %A 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            SLURM_CONF=$conf scancel $jobs || true
            i=0
            while [ -n "$(SLURM_CONF=$conf timeout 2 squeue -h -o %A 2>/dev/null || true)" ] && [ $i -lt 150 ]; do
                i=$((i + 1)); sleep 0.1
            done
        fi
        SLURM_CONF=$conf timeout 10 scontrol shutdown >/dev/null 2>&1 || true
    fi
    for pidfile in "$base"/run/slurmd.*.pid "$base/run/slurmctld.pid"; do
        i=0
        while alive "$pidfile" && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
        if alive "$pidfile"; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
        i=0
        while alive "$pidfile" && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
        if alive "$pidfile"; then kill -KILL "$(cat "$pidfile")" 2>/dev/null || true; fi
    done
    if [ -f "$munge_marker" ]; then
        still=""
        for pidfile in /tmp/joulebench-slurm-*/run/slurmctld.pid; do
            [ "$pidfile" != "$base/run/slurmctld.pid" ] && alive "$pidfile" && still=yes
        done
        if [ -z "$still" ]; then
            alive /run/munge/munged.pid && kill "$(cat /run/munge/munged.pid)"
            rm -f "$munge_marker"
        fi
    fi
    remove_hosts
    remove_files
    log "stopped ($conf)"
}

case $command in
    start) start ;;
    stop) stop ;;
    status) all_idle && { log "running ($conf)"; exit 0; } || { log "not running ($conf)"; exit 1; } ;;
    env) echo "export SLURM_CONF=$conf" ;;
    *) echo "usage: $0 {start|stop|status|env} [--shape 2|4]" >&2; exit 64 ;;
esac
