#!/bin/bash
# joulebench job script: one benchmark run on one allocation (Slurm) or on this machine (local).
#
#   sbatch [resources] jube/job.sh SETTINGS     (what `jbprofile.py submit` does for Slurm systems)
#   bash jube/job.sh SETTINGS                   (the `local` system)
#
# SETTINGS is a file of JB_* variables written by jube/jbprofile.py (the resolved system profile and
# driver arguments); nothing site-specific lives here. The script
#   1. runs the profile's setup lines (module loads, venv),
#   2. for a point that asks for GPU settings (power_limit, sm_clock), starts one `device_settings hold` per
#      node that applies them and restores them when the run ends (docs/sweeps.md), then
#      starts one `jpwr serve` sampler per node (srun, one task per node, overlapping the ranks),
#   3. launches the ranks (srun, or processes locally); they mark windows on the node's sampler
#      and put the window energy into their run record; their stderr reaches job.err tagged with the rank
#      (srun --label; local ranks through run/ranks/<rank>.err) after a line for each rank that ended badly,
#      so that jbrecord.py can name the rank that failed first in its own words,
#   4. stops the samplers (they write <run>/energy/<node>/summary.json + trace.h5), `jpwr combine`s them,
#   5. always finalises the run record and writes result.txt for JUBE, then touches the done file JUBE
#      waits for -- also on failure, at the stop budget and on scancel -- so every configuration gets its row.
#
# Time limit: the job's own timer, counted from its start, stops the run at the stop budget = time limit
# minus a margin (JB_STOP_MARGIN_S: 10 % of the limit, at least 10 s, at most 5 min) that is kept for the
# samplers and the record; the drivers get the same deadline (--exit-duration-mins) and stop themselves at
# an iteration boundary. Slurm's USR1 (--signal=B:USR1@margin; Slurm sends it up to a minute early) only
# re-reads the time left from Slurm: it stops the run when the limit is nearer than the margin (a lowered
# limit, or a timer that did not fire). A TERM from Slurm is its time limit (squeue's reason TimeLimit) or
# a cancellation (scancel, preemption).
#
# Exit code = the final status (joulebench.record.EXIT_CODES, docs/jube.md): OK and PARTIAL 0 (Slurm: COMPLETED),
# FAILED 1 (FAILED), TIMEOUT 124, CANCELLED 143. Ranks that end on their own with another code than 0 leave the
# status to the driver's record (its own clean stop exits 124), else it is FAILED (jbrecord.py). A TIMEOUT job
# holds its allocation until Slurm's limit ends it, so that Slurm records TIMEOUT too (at most the margin); a
# cancelled job is CANCELLED in Slurm anyway. The log's last joulebench line is "finished: status X (reason)".
set -u

settings=${1:?usage: job.sh SETTINGS_FILE}
settings=$(cd "$(dirname "$settings")" && pwd)/$(basename "$settings")
# shellcheck disable=SC1090
. "$settings"
cd "$JB_WORKDIR" || exit 1
# Word lists of the profile, in the shell-quoted form jbprofile.py checked and wrote (jbshell.py): the same words
# here as in the Python tools' shlex.split. py: the job's Python inside the container prefix, as the tools run it
# (jbsettings.job_python). ${a[@]+"${a[@]}"}: an empty array under `set -u` in bash < 4.4.
eval "container=($JB_CONTAINER)"
eval "srun_args=($JB_SRUN_ARGS)"
PY=$JB_PYTHON
py=(${container[@]+"${container[@]}"} "$PY")

status=OK
reason=""
ranks_pid=""
sampler_pid=""
settings_pid=""
timer_pid=""
ranks_rc=0  # how the ranks ended when this script did not stop them: the record decides, else job.err (jbrecord.py)
stop_at_s=""
finished=""
started_s=$(date +%s)
out=$JB_OUT_DIR
energy_dir=$out/energy
settings_dir=$out/device_settings  # one <node>.json per node: requested, read back, restored (jbrecord.py merges)
# Local ranks write their stderr here, one <rank>.err each; job.err gets it tagged with the rank once they ended
# (srun --label tags it as it comes), so that jbrecord.py finds the failing rank's own words in job.err either way.
rank_logs=$out/ranks
rank_logs_copied=""
mkdir -p "$energy_dir"
# A provisional row while the job runs (`jube result -a` on a half-finished run); the recorder replaces it at the end.
printf 'JB status=RUNNING\nJB job_id=%s\nJB note=running since %s\nJB short_note=running\n' \
    "${SLURM_JOB_ID:-n/a}" "$(date -u +%H:%M:%SZ)" > "$JB_WORKDIR/result.txt.running" &&
    mv -f "$JB_WORKDIR/result.txt.running" "$JB_WORKDIR/result.txt"

elapsed() { echo $(($(date +%s) - started_s)); }
log() { echo "joulebench-job: [$(elapsed) s] $*" >&2; }

# Samplers and ranks find each other through this socket path ({node} = Slurm node name).
export JPWR_ADDR="${TMPDIR:-/tmp}/jpwr-${SLURM_JOB_ID:-local$$}-{node}.sock"
export JPWR_RUN_ID=$JB_RUN_ID
[ -n "$JB_CPUS_PER_TASK" ] && export OMP_NUM_THREADS=$JB_CPUS_PER_TASK

# The job's own timer: USR2 to this script `$1` seconds after the job's start.
arm_timer() {
    [ -n "$timer_pid" ] && kill "$timer_pid" 2>/dev/null
    local wait_s=$(($1 - $(elapsed)))
    [ $wait_s -lt 0 ] && wait_s=0
    (trap 'kill $sleeper 2>/dev/null; exit 0' TERM; sleep "$wait_s" & sleeper=$!; wait $sleeper && kill -USR2 $$) &
    timer_pid=$!
    stop_at_s=$1
}

# Seconds of the time limit Slurm still grants this job (empty outside Slurm or when squeue does not answer).
slurm_seconds_left() {
    [ "$JB_LAUNCHER" = slurm ] || return 0
    squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null | awk -F'[-:]' '
        NF == 4 {print $1 * 86400 + $2 * 3600 + $3 * 60 + $4; exit}
        NF == 3 {print $1 * 3600 + $2 * 60 + $3; exit}
        NF == 2 {print $1 * 60 + $2; exit}'
}

# Seconds to wait for ranks and samplers to stop: generous after a normal end, within the margin at a deadline.
stop_wait_s=60

# The local system with several node identities on this host (JB_NODES > 1; issue 21): node i is named
# <host>-n<i> (JPWR_NODE_NAME) and owns JB_TASKS_PER_NODE = d devices, i*d ... i*d+d-1 (one rank per device). Its
# sampler meters those (JB_LOCAL_NODE_DEVICES=own) or every device (=all: each is then counted once, on one node, with
# a warning).
local_node_name() { echo "$(hostname -s)-n$1"; }
local_own_devices() { seq -s, $(($1 * JB_TASKS_PER_NODE)) $((($1 + 1) * JB_TASKS_PER_NODE - 1)); }
local_devices() {  # the device list node $1 sees: its own first, then the others (a rank's cuda:LOCAL_RANK is its own)
    local i others=""
    for ((i = 0; i < JB_NODES; i++)); do [ "$i" -ne "$1" ] && others="$others,$(local_own_devices "$i")"; done
    echo "$(local_own_devices "$1")$others"
}

# The local system with one node (issue 43): the job's devices are the first JB_TASKS_PER_NODE of those this script
# may use (CUDA_VISIBLE_DEVICES, or HIP_VISIBLE_DEVICES on AMD, as set for it; else the host's devices from 0), in
# PCI order. The rank and the sampler inherit the same binding, so the sampler meters exactly the GPUs the rank uses:
# an idle GPU beside them stays out of the headline (`meter_whole_node = yes` puts it on its own line).
bind_local_devices() {
    local var=CUDA_VISIBLE_DEVICES
    [ "$JB_VENDOR" = amd ] && var=HIP_VISIBLE_DEVICES
    local visible
    if [ -n "${!var+x}" ]; then visible=${!var}; else visible=$(seq -s, 0 $((JB_TASKS_PER_NODE - 1))); fi
    export "$var=$(echo "$visible" | cut -d, -f1-"$JB_TASKS_PER_NODE")"
    export CUDA_DEVICE_ORDER=PCI_BUS_ID  # device index i is NVML's index i, for the sampler and the rank
    log "the job's devices: $var=${!var}"
}

# Slurm: each node's sampler and ranks get Slurm's GPU binding (CUDA_VISIBLE_DEVICES in every step; the sampler's step
# overlaps the ranks' with the job's GRES), so the sampler meters the allocated GPUs alone even where the job sees all
# of the node's (ConstrainDevices=no). Slurm's indices follow the node's gres.conf, in PCI order: so do CUDA's and
# NVML's with CUDA_DEVICE_ORDER=PCI_BUS_ID. The record names the metered GPUs by UUID (jbrecord.py job_devices).
slurm_binding() {
    export CUDA_DEVICE_ORDER=PCI_BUS_ID
    log "the job's devices on $(hostname -s) (Slurm's binding): CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" \
        "SLURM_JOB_GPUS=${SLURM_JOB_GPUS-unset}"
}

# `jpwr serve` options every sampler of the job gets: the whole-node line where the profile asks for it.
serve_args=(--methods "$JB_JPWR_METHODS" --out "$energy_dir" --run-id "$JB_RUN_ID")
[ "${JB_METER_WHOLE_NODE:-no}" = yes ] && serve_args+=(--whole-node)

start_local_samplers() {
    export CUDA_DEVICE_ORDER=PCI_BUS_ID  # device index i is NVML's index i, for the samplers and the ranks
    (
        trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' TERM
        for ((i = 0; i < JB_NODES; i++)); do
            seen=$(local_own_devices "$i")
            [ "$JB_LOCAL_NODE_DEVICES" = all ] && seen=$(local_devices "$i")
            JPWR_NODE_NAME=$(local_node_name "$i") CUDA_VISIBLE_DEVICES=$seen "${py[@]}" -m jpwr serve \
                "${serve_args[@]}" &
        done
        wait
    ) >> "$out/jpwr-serve.log" 2>&1 &
}

# What srun logs for a task that ends badly, for local ranks: rank, node, status as `wait` gives it.
log_rank_end() {
    local what="Exited with exit code $3"
    [ "$3" -gt 128 ] && what="Killed by SIG$(kill -l $(($3 - 128)))"
    log "$2: task $1: $what"
}

# The one rank on this host (nodes = 1, one device, or a host without a GPU): stderr to its own file, the node's own
# devices and name.
launch_local_rank() {
    "${py[@]}" -m "$JB_DRIVER" "${JB_DRIVER_COMMAND:-train}" "${train_args[@]}" --out-dir "$out" \
        2>> "$rank_logs/0.err" &
}

# Several local ranks (issue 43: nodes = 1, devices d > 1: data parallel over the job's d GPUs; issue 21: nodes = N
# node identities, one rank each): as `torchrun --nproc-per-node d` sets them up (RANK, LOCAL_RANK, WORLD_SIZE, ...),
# started here so that each rank's stderr has its own file and the first rank to fail ends the others.
rank_node() { echo $(($1 / JB_TASKS_PER_NODE)); }
rank_node_name() { if [ "$JB_NODES" -gt 1 ]; then local_node_name "$(rank_node "$1")"; else hostname -s; fi; }
launch_local_ranks() {
    (
        trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' TERM
        pids=()
        for ((i = 0; i < JB_WORLD_SIZE; i++)); do
            node=$(rank_node "$i")
            identity=()  # one node: the binding of bind_local_devices and the host's name, inherited
            [ "$JB_NODES" -gt 1 ] && identity=(JPWR_NODE_NAME="$(local_node_name "$node")"
                CUDA_VISIBLE_DEVICES="$(local_devices "$node")")
            env ${identity[@]+"${identity[@]}"} RANK=$i GROUP_RANK=$node LOCAL_RANK=$((i % JB_TASKS_PER_NODE)) \
                LOCAL_WORLD_SIZE=$JB_TASKS_PER_NODE WORLD_SIZE=$JB_WORLD_SIZE MASTER_ADDR=127.0.0.1 \
                "${py[@]}" -m "$JB_DRIVER" "${JB_DRIVER_COMMAND:-train}" "${train_args[@]}" \
                --out-dir "$out" 2>> "$rank_logs/$i.err" &
            pids+=($!)
        done
        # As srun --kill-on-bad-exit: each rank that ends badly is logged in the order they end, and the first ends
        # the others: TERM, then KILL after Slurm's default KillWait (a rank waiting for a dead peer ignores TERM).
        code=0 left=$JB_WORLD_SIZE killer=""
        while [ $left -gt 0 ]; do
            wait -n 2>/dev/null  # (bash's own "Killed" notice: log_rank_end says it)
            for i in "${!pids[@]}"; do
                pid=${pids[$i]}
                # still running, or a zombie that the next wait -n reaps
                { [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; } || continue
                wait "$pid" 2>/dev/null
                rc=$?
                pids[i]=""
                left=$((left - 1))
                [ $rc -eq 0 ] && continue
                log_rank_end "$i" "$(rank_node_name "$i")" $rc
                [ $code -eq 0 ] || continue
                code=$rc
                # shellcheck disable=SC2086
                kill -TERM ${pids[*]} 2>/dev/null
                # shellcheck disable=SC2086
                (trap 'kill $sleeper 2>/dev/null; exit 0' TERM; sleep 30 & sleeper=$!; wait $sleeper \
                    && kill -KILL ${pids[*]} 2>/dev/null) &
                killer=$!
            done
        done
        [ -n "$killer" ] && kill "$killer" 2>/dev/null
        exit $code
    ) &
}

copy_rank_logs() {  # local ranks' stderr into job.err, each line tagged with its rank as srun --label does; once
    local log
    [ -d "$rank_logs" ] && [ -z "$rank_logs_copied" ] || return 0
    rank_logs_copied=1
    for log in "$rank_logs"/*.err; do
        [ -f "$log" ] && sed "s/^/$(basename "$log" .err): /" "$log" >&2
    done
}

start_samplers() {
    if [ "$JB_LAUNCHER" = local ] && [ "$JB_NODES" -gt 1 ]; then
        start_local_samplers
    elif [ "$JB_LAUNCHER" = slurm ]; then
        # One task per node; --overlap shares the allocation with the ranks' step.
        srun --overlap --job-name=jpwr-serve --nodes="$JB_NODES" --ntasks="$JB_NODES" --ntasks-per-node=1 \
            "${py[@]}" -m jpwr serve "${serve_args[@]}" >> "$out/jpwr-serve.log" 2>&1 &
    else  # local, one node: the binding of bind_local_devices, inherited
        "${py[@]}" -m jpwr serve "${serve_args[@]}" >> "$out/jpwr-serve.log" 2>&1 &
    fi
    sampler_pid=$!
    # Each sampler writes <energy_dir>/<node>/ready once its socket listens (the run directory is shared).
    local waited=0 ready
    while :; do
        ready=$(find "$energy_dir" -mindepth 2 -maxdepth 2 -name ready 2>/dev/null | wc -l)
        [ "$ready" -ge "$JB_NODES" ] && break
        if ! kill -0 "$sampler_pid" 2>/dev/null || [ $waited -ge 600 ]; then
            log "jpwr samplers not ready ($ready of $JB_NODES nodes), see $out/jpwr-serve.log; energy will be n/a"
            return
        fi
        sleep 0.1; waited=$((waited + 1))
    done
    log "jpwr samplers ready on $ready node(s)"
}

# GPU settings of this point: one `hold` per node (node identities of `local` share one) applies them, keeps them
# during the run and restores them when stop_settings_guard TERMs it, when Slurm TERMs every step (time limit,
# scancel) or when this script vanishes; after SIGKILL the epilog's `restore` does (docs/sweeps.md).
start_settings_guard() {
    [ -n "$JB_POWER_LIMIT$JB_SM_CLOCK" ] || return 0
    mkdir -p "$settings_dir"
    local nodes=1 args=(hold --device-settings "$JB_DEVICE_SETTINGS" --vendor "$JB_VENDOR"
        --power-limit "$JB_POWER_LIMIT" --sm-clock "$JB_SM_CLOCK" --job-id "${SLURM_JOB_ID:-local-$JB_RUN_ID}"
        --record "$settings_dir/{node}.json")
    [ -n "$JB_ZEUSD_SOCKET" ] && args+=(--zeusd-socket "$JB_ZEUSD_SOCKET")
    log "applying device settings (power_limit=${JB_POWER_LIMIT:-own} W, sm_clock=${JB_SM_CLOCK:-own} MHz)"
    if [ "$JB_LAUNCHER" = slurm ]; then
        nodes=$JB_NODES
        srun --overlap --job-name=jb-settings --nodes="$JB_NODES" --ntasks="$JB_NODES" --ntasks-per-node=1 \
            "${py[@]}" -m joulebench.device_settings "${args[@]}" >> "$out/device-settings.log" 2>&1 &
    else
        [ -z "${CUDA_VISIBLE_DEVICES+x}" ] && args+=(--devices "$(local_devices 0)")  # the GPUs the ranks will use
        CUDA_DEVICE_ORDER=PCI_BUS_ID "${py[@]}" -m joulebench.device_settings "${args[@]}" \
            >> "$out/device-settings.log" 2>&1 &
    fi
    settings_pid=$!
    while [ "$(find "$settings_dir" -maxdepth 1 -name '*.json' | wc -l)" -lt "$nodes" ]; do
        if ! kill -0 "$settings_pid" 2>/dev/null; then
            status=FAILED
            reason="device settings not applied: $(sed -n 's/.*error: //p' "$out/device-settings.log" | tail -n 1)"
            log "$reason"
            return 1
        fi
        sleep 0.1
    done
    log "device settings applied on $nodes node(s), see $out/device-settings.log"
}

stop_settings_guard() {
    [ -n "$settings_pid" ] || return 0
    if [ "$JB_LAUNCHER" = slurm ]; then signal_step jb-settings; else kill -TERM "$settings_pid" 2>/dev/null; fi
    wait_gone "$settings_pid" "$stop_wait_s" || { log "device settings guard did not stop within $stop_wait_s s"; \
        kill -KILL "$settings_pid"; }
    wait "$settings_pid" 2>/dev/null || log "device settings not restored on every node, see $out/device-settings.log"
    settings_pid=""
}

wait_gone() {  # pid, seconds
    local waited=0
    while kill -0 "$1" 2>/dev/null && [ $waited -lt $(($2 * 10)) ]; do sleep 0.1; waited=$((waited + 1)); done
    ! kill -0 "$1" 2>/dev/null
}

# Slurm: TERM to the tasks of this job's step named $1 (not to srun, which would kill the step at once).
signal_step() {
    local step
    step=$(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' 2>/dev/null | awk -v name="$1" '$2 == name {print $1}')
    [ -n "$step" ] && scancel --signal=TERM "$step"
}

stop_samplers() {
    [ -n "$sampler_pid" ] || return 0
    if [ "$JB_LAUNCHER" = slurm ]; then signal_step jpwr-serve; else kill -TERM "$sampler_pid" 2>/dev/null; fi
    local killed=""
    wait_gone "$sampler_pid" "$stop_wait_s" || {
        log "samplers did not stop within $stop_wait_s s"; kill -KILL "$sampler_pid"; killed=1; }
    wait "$sampler_pid" 2>/dev/null
    sampler_pid=""
    # A sampler killed before it unlinked its socket leaves it behind: this node's (a node's own /tmp) goes here
    # shellcheck disable=SC2086  # the glob is wanted: {node} stands for any node name
    if [ -n "$killed" ]; then rm -f ${JPWR_ADDR//\{node\}/*}; fi
    "${py[@]}" -m jpwr combine "$energy_dir" --run-id "$JB_RUN_ID" --expected-nodes "$JB_NODES" \
        >> "$out/jpwr-serve.log" 2>&1 \
        || log "jpwr combine failed, see $out/jpwr-serve.log"
}

stop_ranks() {
    [ -n "$ranks_pid" ] || return 0
    # The drivers stop at their next iteration boundary and write their record.
    if [ "$JB_LAUNCHER" = slurm ]; then signal_step jb-ranks; else kill -TERM "$ranks_pid" 2>/dev/null; fi
    wait_gone "$ranks_pid" "$stop_wait_s" || { log "ranks did not stop within $stop_wait_s s"; kill -KILL "$ranks_pid"; }
    wait "$ranks_pid" 2>/dev/null
    ranks_pid=""
    copy_rank_logs
}

# A TIMEOUT job waits for Slurm's limit when it is near (Slurm then records TIMEOUT as well): the seconds to wait.
seconds_to_hold() {
    local left
    left=$(slurm_seconds_left)
    [ -n "$left" ] && [ "$left" -gt 0 ] && [ "$left" -le $((JB_STOP_MARGIN_S + 60)) ] && echo "$left"
}

finish() {
    [ -n "$finished" ] && return
    finished=1
    set +e  # setup lines that ended the script under their own `set -e` leave it on
    trap '' USR1 USR2 TERM INT
    [ -n "$timer_pid" ] && kill "$timer_pid" 2>/dev/null
    [ "$status" = OK ] || stop_wait_s=$((JB_STOP_MARGIN_S / 3 > 5 ? JB_STOP_MARGIN_S / 3 : 5))
    stop_ranks
    stop_samplers
    stop_settings_guard
    "${py[@]}" "$JB_REPO/jube/jbrecord.py" finalize --settings "$settings" --status "$status" \
        --reason "$reason" --elapsed-s "$(elapsed)" --ranks-exit-code "$ranks_rc" > "$out/finalize.log" 2>&1
    code=$?
    final=$(sed -n 's/^JB status=//p' "$JB_WORKDIR/result.txt" 2>/dev/null)
    case $final in PENDING | RUNNING) final="" ;; esac  # still the provisional row: the recorder wrote none
    if [ -z "$final" ]; then  # the recorder did not run (a broken interpreter or container prefix): the row says so
        final=FAILED; code=1
        why="the job script could not finalise the run record: see $out/finalize.log"
        printf 'JB status=FAILED\nJB note=%s\nJB status_reason=%s\n' "$why" "$why" > "$JB_WORKDIR/result.txt.failed" &&
            mv -f "$JB_WORKDIR/result.txt.failed" "$JB_WORKDIR/result.txt"
        log "could not finalise the run record, see $out/finalize.log"
    fi
    # finalize touched it already, unless it could not run; after the row above: the compare step, which writes the
    # full table once every point is done, must not read a provisional row
    touch "$JB_DONE_FILE"
    why=$(sed -n 's/^JB status_reason=//p' "$JB_WORKDIR/result.txt" 2>/dev/null)
    hold=""
    [ "$final" = TIMEOUT ] && hold=$(seconds_to_hold)
    [ -n "$hold" ] && log "holding the allocation until Slurm's time limit (${hold} s left) so that Slurm records" \
        "TIMEOUT too"
    log "finished: status $final${why:+ ($why)} after $(elapsed) s; exit code $code"  # the log's last line
    if [ -n "$hold" ]; then
        trap 'exit 124' TERM
        while :; do sleep 5 & wait $!; done
    fi
    exit $code
}

# The stop budget is reached (the job's timer) or Slurm's limit is nearer than the margin (USR1).
stop_at_deadline() {
    status=TIMEOUT
    reason="$1"
    log "$reason; stopping the run"
    finish
}

on_timer() {
    stop_at_deadline "stop budget reached after $(elapsed) s: time limit $JB_TIME_LIMIT minus ${JB_STOP_MARGIN_S} s kept for the record"
}

on_slurm_warning() {
    local left
    left=$(slurm_seconds_left)
    if [ -z "$left" ] || [ "$left" -le "$JB_STOP_MARGIN_S" ]; then
        stop_at_deadline "Slurm's time-limit warning after $(elapsed) s (${left:-unknown} s of $JB_TIME_LIMIT left)"
    fi
    log "Slurm's time-limit warning arrived early (${left} s left; Slurm signals up to a minute early)"
    local slurm_stop=$(($(elapsed) + left - JB_STOP_MARGIN_S))
    [ "$slurm_stop" -lt "$stop_at_s" ] && arm_timer "$slurm_stop"  # the limit was lowered: follow Slurm
}

on_terminate() {
    local why=""
    [ "$JB_LAUNCHER" = slurm ] && why=$(squeue -h -j "$SLURM_JOB_ID" -o %r 2>/dev/null)
    if [ "$why" = TimeLimit ]; then
        status=TIMEOUT; reason="Slurm's time limit $JB_TIME_LIMIT ended the job after $(elapsed) s (SIG$1) before its own stop"
    else
        status=CANCELLED; reason="cancelled: SIG$1 after $(elapsed) s (scancel, preemption or a signal to the job)"
    fi
    log "$reason"
    finish
}

trap on_timer USR2
trap on_slurm_warning USR1
trap 'on_terminate TERM' TERM
trap 'on_terminate INT' INT
trap finish EXIT
arm_timer "$JB_STOP_BUDGET_S"
log "time limit $JB_TIME_LIMIT: the run stops at ${JB_STOP_BUDGET_S} s, ${JB_STOP_MARGIN_S} s are kept for the record"

# The profile's setup lines, as the tools run them (jbsettings.in_profile_shell): no positional parameters, `set -u`
# off (module and activate scripts read unset variables); a non-zero status, or lines that end this script (`exit`,
# `set -e` and a failing command: the EXIT trap records it), fail the run. The shell's options are restored after.
if [ -n "$JB_SETUP" ]; then
    status=FAILED
    reason="profile setup lines ended the job script (exit, or set -e and a failing command): $JB_SETUP"
    _o=$(set +o)
    set +u --
    eval "$JB_SETUP"
    rc=$?
    eval "$_o"
    status=OK reason=""
    [ $rc -eq 0 ] || { status=FAILED; reason="profile setup lines failed (exit $rc): $JB_SETUP"; }
fi
# torch.compile's caches (joulebench.compile_cache): later jobs on this node load what an earlier one compiled (a
# cold ResNet-50 compile is minutes). /tmp is node-local; a site whose /tmp lives only as long as the job sets
# JOULEBENCH_COMPILE_CACHE to a lasting node-local directory in its profile's setup lines (docs/jube.md).
export JOULEBENCH_COMPILE_CACHE="${JOULEBENCH_COMPILE_CACHE:-/tmp/joulebench-compile-$(id -u)}"
# The drivers pick their ranks up from Slurm. Rank 0 runs on this (the first) node and listens on
# MASTER_PORT (TF workers on MASTER_PORT + rank): free right now and below the kernel's ephemeral range (see
# jbport.py), not one derived from the job id, which collides with whatever else runs on a shared node.
MASTER_PORT=$("$PY" "$JB_REPO/jube/jbport.py" --span "${JB_WORLD_SIZE:-1}") \
    && export MASTER_PORT || log "no free port found; the drivers fall back to their default"
if [ -n "${JB_CONTAINER_BIND_VAR:-}" ]; then
    # `container` tag: the image also needs the run directory and the samplers' socket directory, which only
    # the job knows (Apptainer appends $APPTAINER_BIND to the prefix's --bind list).
    export "$JB_CONTAINER_BIND_VAR=${!JB_CONTAINER_BIND_VAR:+${!JB_CONTAINER_BIND_VAR},}$JB_WORKDIR,${TMPDIR:-/tmp}"
fi

[ "$status" = OK ] && [ "$JB_LAUNCHER" = local ] && [ "$JB_NODES" -eq 1 ] && bind_local_devices
[ "$status" = OK ] && [ "$JB_LAUNCHER" = slurm ] && slurm_binding
[ "$status" = OK ] && start_settings_guard
if [ "$status" = OK ]; then
    start_samplers
    eval "train_args=($JB_TRAIN_ARGS)"  # shell-quoted by jbprofile.py
    # a serving point with a server (engine named in the profile): the server's port, free on this node (jbport.py)
    if [ -n "${JB_SERVER:-}" ] && [ -n "${MASTER_PORT:-}" ]; then train_args+=(--server-port "$MASTER_PORT"); fi
    left_s=$((JB_STOP_BUDGET_S - $(elapsed)))
    [ $left_s -gt 0 ] || on_timer
    if [ "$JB_SELF_STOP" = yes ]; then  # the driver stops itself at the same deadline, at an iteration boundary
        train_args+=(--exit-duration-mins "$(awk -v s=$left_s 'BEGIN {printf "%.3f", s / 60}')")
    fi
    log "launching $JB_WORLD_SIZE rank(s) of $JB_DRIVER on $JB_NODES node(s)"
    if [ "$JB_LAUNCHER" = slurm ]; then
        srun --kill-on-bad-exit=1 --label --job-name=jb-ranks --nodes="$JB_NODES" --ntasks="$JB_WORLD_SIZE" \
            --ntasks-per-node="$JB_TASKS_PER_NODE" ${srun_args[@]+"${srun_args[@]}"} \
            "${py[@]}" -m "$JB_DRIVER" "${JB_DRIVER_COMMAND:-train}" "${train_args[@]}" --out-dir "$out" &
    else
        mkdir -p "$rank_logs"
        if [ "$JB_WORLD_SIZE" -gt 1 ]; then launch_local_ranks; else launch_local_rank; fi
    fi
    ranks_pid=$!
    wait "$ranks_pid"
    rc=$?
    while [ $rc -gt 128 ] && kill -0 "$ranks_pid" 2>/dev/null; do  # a trap (Slurm's early warning) interrupted
        wait "$ranks_pid"
        rc=$?
    done
    ranks_pid=""
    [ $rc -ne 0 ] && [ "$JB_LAUNCHER" = local ] && [ "$JB_WORLD_SIZE" -eq 1 ] && log_rank_end 0 "$(hostname -s)" $rc
    copy_rank_logs
    ranks_rc=$rc
fi
finish
