#!/bin/sh
# A real, small Slurm cluster on this one machine, for CI and for trying the JUBE workflows.
#
#   jube/slurm-local.sh start  [--shape 2|4|gpu]   start (idempotent); prints the `export ...` lines to use it
#   jube/slurm-local.sh stop   [--shape 2|4|gpu]   cancel jobs, stop the daemons it started, undo what start changed on
#                                                  the machine and remove its files (also after a failed start)
#   jube/slurm-local.sh status [--shape 2|4|gpu]   exit 0 when every node is idle/allocated
#   jube/slurm-local.sh env    [--shape 2|4|gpu]   print the `export ...` lines
#
# Debian's slurmctld/slurmd/munge (see docs/jube.md for the apt-get line), found on PATH, or unpacked from their
# .deb files under JOULEBENCH_SLURM_PREFIX (a machine without apt: docs/jube.md, "Slurm on one GPU machine"); then the
# client commands run through wrappers in <base>/bin that `env` puts first on PATH. Three shapes with different names,
# so that a workflow that runs on several relies only on its profile/environment:
#   shape 2:   nodes n1-n2 (127.0.0.11-12), partition "debug" (default), 2 fake GPUs per node
#   shape 4:   nodes c1-c4 (127.0.0.21-24), partitions "devel" (c1-c2, default) and "booster" (c1-c4)
#   shape gpu: one node named after this host with its real NVIDIA GPUs as GRES (counted by `nvidia-smi -L`, device
#              files /dev/nvidia<i>, or JOULEBENCH_SLURM_GPU_DEVICE_DIR/nvidia<i> for a test's fake ones), partition
#              "gpu"; its own munged (key and socket under <base>), so it needs no system munge. Jobs see every GPU
#              of the node (ConstrainDevices=no); Slurm's binding (CUDA_VISIBLE_DEVICES) says which are theirs.
# Shapes 2 and 4 run several slurmd on one host with `slurmd -N <node>`, each with its own loopback address, port,
# spool and log; their fake GPUs are GRES backed by character devices, so `--gpus-per-node` is scheduled for real
# (nothing is isolated: no cgroups). Each shape has its own ports, so the three can run at the same time.
#
# cgroup v2 without systemd (a VM whose PID 1 is not systemd): slurmd 22.05 does not start until cgroup.conf selects
# cgroup/v2 with IgnoreSystemd=yes and /sys/fs/cgroup/system.slice has the cpuset, cpu, memory and pids controllers;
# the gpu shape then writes that cgroup.conf and creates system.slice (only if missing), and `stop` removes what it
# created (the cgroups slurmd made under it included). Nothing of this happens on cgroup v1 or a systemd host.
#
# Everything lives under $JOULEBENCH_SLURM_BASE (default /tmp/joulebench-slurm-<shape>), which `stop` removes with
# the shape's /etc/hosts lines and the /usr/sbin/slurmstepd link it made, so that nothing is left behind. Root only.
set -eu

command=${1:-}
[ $# -gt 0 ] && shift
shape=2
while [ $# -gt 0 ]; do
    case $1 in
        --shape) shape=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
        --shape=*) shape=${1#--shape=}; shift ;;
        *) echo "slurm-local: unknown option $1" >&2; exit 64 ;;
    esac
done

base=${JOULEBENCH_SLURM_BASE:-/tmp/joulebench-slurm-$shape}
prefix=${JOULEBENCH_SLURM_PREFIX:-}
cgroot=${JOULEBENCH_SLURM_CGROUP_ROOT:-/sys/fs/cgroup}
host=$(hostname -s)
case $shape in
    2) node_prefix=n; first_ip=11; ctld_port=6817; node_port=6821; cluster=jbci2; node_count=2
       partitions="PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP" ;;
    4) node_prefix=c; first_ip=21; ctld_port=6917; node_port=6921; cluster=jbci4; node_count=4
       partitions="PartitionName=devel Nodes=c[1-2] Default=YES MaxTime=INFINITE State=UP
PartitionName=booster Nodes=c[1-4] Default=NO MaxTime=INFINITE State=UP" ;;
    gpu) ctld_port=7017; node_port=7021; cluster=jbgpu; node_count=1
         partitions="PartitionName=gpu Nodes=$host Default=YES MaxTime=INFINITE State=UP" ;;
    *) echo "slurm-local: --shape must be 2, 4 or gpu, not '$shape'" >&2; exit 64 ;;
esac
conf=$base/slurm.conf
if [ "$shape" = gpu ]; then nodes=$host; else nodes=$(seq 1 "$node_count" | sed "s/^/$node_prefix/"); fi

# Set when this script started the system munged; shared by shapes 2 and 4: whichever stops last stops munged.
munge_marker=${JOULEBENCH_SLURM_MUNGE_MARKER:-/tmp/joulebench-slurm-started-munge}
munge_socket=/run/munge/munge.socket.2
[ "$shape" = gpu ] && munge_socket=$base/run/munge/munge.socket

log() { echo "slurm-local: $*" >&2; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

# ---- where the binaries are: PATH, or the unpacked packages under $prefix ----
lib_path() {
    found=""
    for dir in "$prefix"/usr/lib/*-linux-gnu "$prefix"/usr/lib/*-linux-gnu/slurm-wlm "$prefix"/lib/*-linux-gnu; do
        [ -d "$dir" ] && found="$found${found:+:}$dir"
    done
    echo "$found"
}

plugin_dir() { for dir in "$prefix"/usr/lib/*-linux-gnu/slurm-wlm; do [ -d "$dir" ] && echo "$dir" && return; done; }

# A daemon's path: PATH (Debian's alternatives), else a link named after it to its -wlm binary under the prefix (Slurm
# reads its own role from its program name: started as slurmd-wlm, slurmd ignores the node's Gres= line).
daemon() {
    if [ -z "$prefix" ]; then command -v "$1" || true; return; fi
    [ -x "$prefix/usr/sbin/$1-wlm" ] || return 0
    mkdir -p "$base/sbin"
    ln -sf "$prefix/usr/sbin/$1-wlm" "$base/sbin/$1"
    echo "$base/sbin/$1"
}

# A client tool (munge, unmunge, munged, sinfo, ...): PATH, or the prefix's.
tool() {
    if [ -z "$prefix" ]; then echo "$1"; return; fi
    for dir in usr/bin usr/sbin; do [ -x "$prefix/$dir/$1" ] && echo "$prefix/$dir/$1" && return; done
    echo "$prefix/usr/bin/$1"
}

# With a prefix, the client commands run through wrappers that set the library path for them alone (the job's own
# processes keep the user's environment).
write_wrappers() {
    [ -n "$prefix" ] || return 0
    mkdir -p "$base/bin"
    for tool in "$prefix"/usr/bin/s* "$prefix"/usr/bin/munge "$prefix"/usr/bin/unmunge; do
        [ -x "$tool" ] || continue
        printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
            "$(lib_path)" "$tool" > "$base/bin/${tool##*/}"
        chmod 755 "$base/bin/${tool##*/}"
    done
}
[ -n "$prefix" ] && [ -d "$base/bin" ] && PATH=$base/bin:$PATH

run_daemon() {  # a daemon with the prefix's libraries
    if [ -n "$prefix" ]; then LD_LIBRARY_PATH=$(lib_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; else "$@"; fi
}

env_lines() {
    [ -n "$prefix" ] && echo "export PATH=$base/bin:\$PATH"
    echo "export SLURM_CONF=$conf"
}

munge_ok() {
    if [ "$shape" = gpu ]; then
        run_daemon "$(tool munge)" -n -S "$munge_socket" 2>/dev/null \
            | run_daemon "$(tool unmunge)" -S "$munge_socket" >/dev/null 2>&1
    else
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1
    fi
}

all_idle() {
    alive "$base/run/slurmctld.pid" || return 1
    states=$(SLURM_CONF=$conf timeout 2 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
    [ "$(printf '%s\n' "$states" | grep -c .)" -eq "$node_count" ] || return 1
    ! printf '%s\n' "$states" | grep -qv ' \(idle\|allocated\|mixed\|completing\)$'
}

# ---- the GPU shape's node: its GPUs, CPUs and memory ----
gpu_count() {
    command -v nvidia-smi >/dev/null || { log "--shape gpu needs nvidia-smi (NVIDIA's driver) on PATH"; exit 1; }
    count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    [ "$count" -gt 0 ] || { log "--shape gpu: nvidia-smi -L lists no GPU"; exit 1; }
    echo "$count"
}

gpu_device_dir() { echo "${JOULEBENCH_SLURM_GPU_DEVICE_DIR:-/dev}"; }

node_line() {
    if [ "$shape" != gpu ]; then
        last_ip=$((first_ip + node_count - 1))
        echo "NodeName=$node_prefix[1-$node_count] NodeHostname=localhost NodeAddr=127.0.0.[$first_ip-$last_ip]" \
             "Port=[$node_port-$((node_port + node_count - 1))] CPUs=2 RealMemory=4000 Gres=gpu:2 State=UNKNOWN"
        return
    fi
    memory_mb=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    echo "NodeName=$host NodeAddr=127.0.0.1 Port=$node_port CPUs=$(nproc --all) RealMemory=$memory_mb Gres=gpu:$gpus" \
         "State=UNKNOWN"
}

gres_line() {
    if [ "$shape" = gpu ]; then
        files=nvidia0  # Slurm 22.05 reads nvidia[0-0] as two files
        [ "$gpus" -gt 1 ] && files="nvidia[0-$((gpus - 1))]"
        echo "NodeName=$host Name=gpu File=$(gpu_device_dir)/$files"
    else
        echo "NodeName=$node_prefix[1-$node_count] Name=gpu File=$base/fakegpu/gpu[0-1]"
    fi
}

check_gpu_devices() {
    i=0
    while [ $i -lt "$gpus" ]; do
        [ -c "$(gpu_device_dir)/nvidia$i" ] || {
            log "nvidia-smi lists $gpus GPU(s) but $(gpu_device_dir)/nvidia$i is no character device"; exit 1; }
        i=$((i + 1))
    done
}

# ---- cgroup v2 without systemd (see the header) ----
needs_cgroup_setup() {
    [ "$shape" = gpu ] && [ -f "$cgroot/cgroup.controllers" ] && [ "$(cat /proc/1/comm 2>/dev/null)" != systemd ]
}

cgroup_setup() {
    if [ ! -d "$cgroot/system.slice" ]; then
        mkdir "$cgroot/system.slice"
        echo "$cgroot/system.slice" > "$base/run/cgroup-created"
    fi
    for controller in cpuset cpu memory pids; do
        echo "+$controller" > "$cgroot/system.slice/cgroup.subtree_control" 2>/dev/null \
            || log "cgroup: could not enable $controller in $cgroot/system.slice (slurmd warns and runs on)"
    done
}

# The cgroups slurmd made (<node>_slurmstepd.scope and below), deepest first, then system.slice if start made it.
cgroup_undo() {
    scope=$cgroot/system.slice/${host}_slurmstepd.scope
    [ -d "$scope" ] && find "$scope" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$scope" ] && log "cgroup: could not remove $scope (processes still in it?)"
    if [ -f "$base/run/cgroup-created" ]; then
        created=$(cat "$base/run/cgroup-created")
        rmdir "$created" 2>/dev/null || log "cgroup: could not remove $created"
    fi
    return 0
}

write_config() {
    mkdir -p "$base/state" "$base/log" "$base/run"
    for node in $nodes; do mkdir -p "$base/spool/$node"; done
    if [ "$shape" != gpu ]; then
        mkdir -p "$base/fakegpu"
        for gpu in 0 1; do
            [ -c "$base/fakegpu/gpu$gpu" ] || mknod "$base/fakegpu/gpu$gpu" c 1 3
        done
    fi
    auth_info=""
    [ "$shape" = gpu ] && auth_info="AuthInfo=socket=$munge_socket"
    plugins=""
    [ -n "$prefix" ] && plugins="PluginDir=$(plugin_dir)"
    cat > "$conf" <<EOF
# Written by jube/slurm-local.sh (shape $shape); edits are overwritten on the next start.
ClusterName=$cluster
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
AuthType=auth/munge
$auth_info
$plugins
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
SchedulerParameters=bf_interval=5,sched_interval=5
GresTypes=gpu
$(node_line)
$partitions
EOF
    gres_line > "$base/gres.conf"
    if needs_cgroup_setup; then
        printf '%s\n' "# Written by jube/slurm-local.sh: cgroup v2 on a host whose cgroups no systemd manages" \
            CgroupPlugin=cgroup/v2 IgnoreSystemd=yes ConstrainDevices=no ConstrainCores=no ConstrainRAMSpace=no \
            > "$base/cgroup.conf"
    fi
}

# Node names must resolve (MASTER_ADDR is the first node of the job); one marked line per node that needs one (the
# gpu shape's node is this host: a line only where its name does not resolve).
host_lines() {
    if [ "$shape" = gpu ]; then
        if [ -f "$base/run/host-line" ]; then cat "$base/run/host-line"
        elif ! getent hosts "$host" >/dev/null 2>&1; then echo "127.0.0.1 $host # joulebench-slurm-local"; fi
        return
    fi
    ip=$first_ip
    for node in $nodes; do
        echo "127.0.0.$ip $node # joulebench-slurm-local"
        ip=$((ip + 1))
    done
}

add_hosts() {
    lines=$(host_lines)
    [ -n "$lines" ] || return 0
    [ "$shape" = gpu ] && printf '%s\n' "$lines" > "$base/run/host-line"
    printf '%s\n' "$lines" | while read -r line; do
        grep -qxF "$line" /etc/hosts || echo "$line" >> /etc/hosts
    done
}

# This shape's lines only (another shape may still run). Rewritten in place: /etc/hosts may be a bind mount.
remove_hosts() {
    ours=$(host_lines)
    [ -n "$ours" ] || return 0
    printf '%s\n' "$ours" | grep -qxF -f - /etc/hosts || return 0
    kept=$(printf '%s\n' "$ours" | grep -vxF -f - /etc/hosts || true)
    printf '%s\n' "$kept" > /etc/hosts
}

# The files `start` made; the directory itself only if nothing else is in it (JOULEBENCH_SLURM_BASE may be any path).
remove_files() {
    rm -rf "$base/state" "$base/log" "$base/run" "$base/spool" "$base/fakegpu" "$base/bin" "$base/sbin" "$base/munge" \
        "$conf" "$base/gres.conf" "$base/cgroup.conf"
    rmdir "$base" 2>/dev/null || true
}

# slurmd starts the slurmstepd it was built with (/usr/sbin/slurmstepd): where the packages are only unpacked, a link
# to the prefix's, removed by stop.
link_slurmstepd() {
    [ -n "$prefix" ] && [ ! -e /usr/sbin/slurmstepd ] || return 0
    ln -s "$prefix/usr/sbin/slurmstepd-wlm" /usr/sbin/slurmstepd
    echo /usr/sbin/slurmstepd > "$base/run/slurmstepd-link"
}

unlink_slurmstepd() {
    [ -f "$base/run/slurmstepd-link" ] || return 0
    link=$(cat "$base/run/slurmstepd-link")
    [ -L "$link" ] && rm -f "$link"
    return 0
}

start_system_munge() {
    munge_ok && return 0
    if [ ! -f /etc/munge/munge.key ]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0600 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$munge_marker"
}

# The gpu shape's own munged: a random key and a socket under the base (munged checks that the socket's directories
# are not writable by others and are searchable by all).
start_own_munge() {
    munge_ok && return 0
    mkdir -p "$base/munge" "$base/run/munge"
    chmod 755 "$base" "$base/run" "$base/run/munge"
    chmod 700 "$base/munge"
    [ -f "$base/munge/munge.key" ] || { dd if=/dev/urandom of="$base/munge/munge.key" bs=1024 count=1 2>/dev/null
                                         chmod 400 "$base/munge/munge.key"; }
    run_daemon "$(tool munged)" --force --key-file="$base/munge/munge.key" --socket="$munge_socket" \
        --pid-file="$base/run/munged.pid" --log-file="$base/log/munged.log" --seed-file="$base/munge/munged.seed"
}

wait_for_munge() {
    i=0
    until munge_ok; do
        i=$((i + 1)); [ $i -gt 50 ] && { log "munged did not come up"; exit 1; }
        sleep 0.1
    done
}

failed_daemon() {  # name, log: a daemon that exited at its start (e.g. slurmd's cgroup set-up), in its own words
    log "$1 did not start; the end of $2:"
    { grep -iE "error|fatal" "$2" 2>/dev/null || tail -n 5 "$2" 2>/dev/null; } | tail -n 5 >&2
    exit 1
}

start() {
    if [ "$(id -u)" -ne 0 ]; then log "must run as root (slurmd, munged)"; exit 1; fi
    if all_idle; then
        log "already running ($conf)"
        env_lines
        return 0
    fi
    if [ -n "$prefix" ]; then
        for needed in "$(daemon slurmctld)" "$(daemon slurmd)" "$(tool munged)" "$(tool sinfo)"; do
            [ -x "$needed" ] && continue
            log "JOULEBENCH_SLURM_PREFIX=$prefix holds no unpacked slurmctld, slurmd, slurm-client and munge" \
                "(usr/sbin/slurmctld-wlm, usr/sbin/munged, usr/bin/sinfo): unpack their .deb files and libraries" \
                "there (docs/jube.md, \"Slurm on one GPU machine\")"
            exit 1
        done
    elif ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
        log "Slurm/munge missing: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge" \
            "(or unpack their .deb files and set JOULEBENCH_SLURM_PREFIX to that root: docs/jube.md)"
        exit 1
    fi
    if [ "$shape" = gpu ]; then
        gpus=$(gpu_count)
        check_gpu_devices
    fi
    mkdir -p "$base/run"
    write_config
    write_wrappers
    [ -n "$prefix" ] && PATH=$base/bin:$PATH
    add_hosts
    if [ "$shape" = gpu ]; then start_own_munge; else start_system_munge; fi
    wait_for_munge
    needs_cgroup_setup && cgroup_setup
    link_slurmstepd
    if ! alive "$base/run/slurmctld.pid"; then
        rm -rf "$base/state"/* "$base/spool"/*/*  # clean slate: no stale DRAIN, job ids restart at 1
        run_daemon "$(daemon slurmctld)" -f "$conf" || failed_daemon slurmctld "$base/log/slurmctld.log"
    fi
    for node in $nodes; do
        alive "$base/run/slurmd.$node.pid" || run_daemon "$(daemon slurmd)" -f "$conf" -N "$node" \
            || failed_daemon "slurmd of $node" "$base/log/slurmd.$node.log"
    done
    i=0
    until all_idle; do
        i=$((i + 1))
        # (slurmctld writes its pid file a moment after it forked: a missing one counts after 3 s)
        if [ $i -gt 150 ] || { [ $i -gt 30 ] && ! alive "$base/run/slurmctld.pid"; }; then
            log "cluster did not become idle; see $base/log/"
            SLURM_CONF=$conf timeout 2 sinfo -N >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    if [ "$shape" = gpu ]; then
        log "running: node $host with $gpus GPU(s) as gres, partition gpu, config $conf"
    else
        log "running: $node_count nodes ($(echo $nodes)), config $conf"
    fi
    env_lines
}

stop_pidfile() {  # TERM after a grace period, then KILL
    i=0
    while alive "$1" && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
    if alive "$1"; then kill "$(cat "$1" 2>/dev/null)" 2>/dev/null || true; fi
    i=0
    while alive "$1" && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
    if alive "$1"; then kill -KILL "$(cat "$1" 2>/dev/null)" 2>/dev/null || true; fi
    return 0
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
        stop_pidfile "$pidfile"
    done
    if [ "$shape" = gpu ] && [ -f "$base/run/munged.pid" ]; then
        kill "$(cat "$base/run/munged.pid" 2>/dev/null)" 2>/dev/null || true
        stop_pidfile "$base/run/munged.pid"
    fi
    if [ "$shape" != gpu ] && [ -f "$munge_marker" ]; then
        still=""
        for pidfile in /tmp/joulebench-slurm-*/run/slurmctld.pid; do
            case $pidfile in */joulebench-slurm-gpu/*) continue ;; esac  # the gpu shape has its own munged
            [ "$pidfile" != "$base/run/slurmctld.pid" ] && alive "$pidfile" && still=yes
        done
        if [ -z "$still" ]; then
            alive /run/munge/munged.pid && kill "$(cat /run/munge/munged.pid)"
            rm -f "$munge_marker"
        fi
    fi
    [ "$shape" = gpu ] && cgroup_undo
    unlink_slurmstepd
    remove_hosts
    remove_files
    log "stopped ($conf)"
}

case $command in
    start) start ;;
    stop) stop ;;
    status) all_idle && { log "running ($conf)"; exit 0; } || { log "not running ($conf)"; exit 1; } ;;
    env) env_lines ;;
    *) echo "usage: $0 {start|stop|status|env} [--shape 2|4|gpu]" >&2; exit 64 ;;
esac
