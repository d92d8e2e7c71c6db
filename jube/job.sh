#!/bin/bash
# joulebench job script: one benchmark run on one allocation (Slurm) or on this machine (local).
#
#   sbatch [resources] jube/job.sh SETTINGS     (what `jbprofile.py submit` does for Slurm systems)
#   bash jube/job.sh SETTINGS                   (the `local` system)
#
# SETTINGS is a file of JB_* variables written by jube/jbprofile.py (the resolved system profile and
# driver arguments); nothing site-specific lives here. The script
#   1. runs the profile's setup lines (module loads, venv),
#   2. starts one `jpwr serve` sampler per node (srun, one task per node, overlapping the ranks),
#   3. launches the ranks (srun, or one process locally); they mark windows on the node's sampler
#      and put the window energy into their run record,
#   4. stops the samplers (they write <run>/energy/<node>/summary.json + trace.h5), `jpwr combine`s them,
#   5. always finalises the run record (status OK / FAILED / TIMEOUT) and writes result.txt for JUBE,
#   6. touches the done file JUBE waits for -- also on failure, USR1 (sent by Slurm 60 s before the
#      time limit: --signal=B:USR1@60) and TERM, so every configuration shows up in the result table.
set -u

settings=${1:?usage: job.sh SETTINGS_FILE}
settings=$(cd "$(dirname "$settings")" && pwd)/$(basename "$settings")
# shellcheck disable=SC1090
. "$settings"
cd "$JB_WORKDIR" || exit 1

status=OK
reason=""
ranks_pid=""
sampler_pid=""
finished=""
started_s=$(date +%s)
out=$JB_OUT_DIR
energy_dir=$out/energy
mkdir -p "$energy_dir"

log() { echo "joulebench-job: $*" >&2; }

# Samplers and ranks find each other through this socket path ({node} = Slurm node name).
export JPWR_ADDR="${TMPDIR:-/tmp}/jpwr-${SLURM_JOB_ID:-local$$}-{node}.sock"
export JPWR_RUN_ID=$JB_RUN_ID
[ -n "$JB_CPUS_PER_TASK" ] && export OMP_NUM_THREADS=$JB_CPUS_PER_TASK

if [ -n "$JB_SETUP" ]; then
    eval "$JB_SETUP" || { status=FAILED; reason="profile setup lines failed: $JB_SETUP"; }
fi
PY=$JB_PYTHON
# The drivers pick their ranks up from Slurm. Rank 0 runs on this (the first) node and listens on
# MASTER_PORT (TF workers on MASTER_PORT + local index): a port free right now, not one derived from the
# job id, which collides with whatever else runs on a shared node.
MASTER_PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])') \
    && export MASTER_PORT || log "no free port found; the drivers fall back to their default"
if [ -n "${JB_CONTAINER_BIND_VAR:-}" ]; then
    # `container` tag: the image also needs the run directory and the samplers' socket directory, which only
    # the job knows (Apptainer appends $APPTAINER_BIND to the prefix's --bind list).
    export "$JB_CONTAINER_BIND_VAR=${!JB_CONTAINER_BIND_VAR:+${!JB_CONTAINER_BIND_VAR},}$JB_WORKDIR,${TMPDIR:-/tmp}"
fi

start_samplers() {
    if [ "$JB_LAUNCHER" = slurm ]; then
        # One task per node; --overlap shares the allocation with the ranks' step.
        # shellcheck disable=SC2086
        srun --overlap --job-name=jpwr-serve --nodes="$JB_NODES" --ntasks="$JB_NODES" --ntasks-per-node=1 \
            $JB_CONTAINER "$PY" -m jpwr serve --methods "$JB_JPWR_METHODS" --out "$energy_dir" \
            --run-id "$JB_RUN_ID" >> "$out/jpwr-serve.log" 2>&1 &
    else
        # shellcheck disable=SC2086
        $JB_CONTAINER "$PY" -m jpwr serve --methods "$JB_JPWR_METHODS" --out "$energy_dir" \
            --run-id "$JB_RUN_ID" >> "$out/jpwr-serve.log" 2>&1 &
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

stop_samplers() {
    [ -n "$sampler_pid" ] || return 0
    if [ "$JB_LAUNCHER" = slurm ]; then
        local step
        step=$(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' 2>/dev/null | awk '$2 == "jpwr-serve" {print $1}')
        [ -n "$step" ] && scancel --signal=TERM "$step"
    else
        kill -TERM "$sampler_pid" 2>/dev/null
    fi
    local waited=0
    while kill -0 "$sampler_pid" 2>/dev/null && [ $waited -lt 600 ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -0 "$sampler_pid" 2>/dev/null && { log "samplers did not stop within 60 s"; kill -KILL "$sampler_pid"; }
    wait "$sampler_pid" 2>/dev/null
    sampler_pid=""
    # shellcheck disable=SC2086
    $JB_CONTAINER "$PY" -m jpwr combine "$energy_dir" --run-id "$JB_RUN_ID" >> "$out/jpwr-serve.log" 2>&1 \
        || log "jpwr combine failed, see $out/jpwr-serve.log"
}

stop_ranks() {
    [ -n "$ranks_pid" ] || return 0
    kill -TERM "$ranks_pid" 2>/dev/null  # srun forwards it to every rank
    local waited=0
    while kill -0 "$ranks_pid" 2>/dev/null && [ $waited -lt 200 ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -KILL "$ranks_pid" 2>/dev/null
    wait "$ranks_pid" 2>/dev/null
    ranks_pid=""
}

finish() {
    [ -n "$finished" ] && return
    finished=1
    trap '' USR1 TERM INT
    stop_ranks
    stop_samplers
    # shellcheck disable=SC2086
    $JB_CONTAINER "$PY" "$JB_REPO/jube/jbrecord.py" finalize --settings "$settings" --status "$status" --reason "$reason" \
        || log "could not finalise the run record"
    touch "$JB_DONE_FILE"  # finalize touched it already, unless it could not run
    log "finished: status $status${reason:+ ($reason)} after $(($(date +%s) - started_s)) s"
}

on_signal() {
    local elapsed=$(($(date +%s) - started_s))
    if [ "$1" = USR1 ]; then
        status=TIMEOUT; reason="time limit $JB_TIME_LIMIT reached (Slurm's warning signal after ${elapsed} s)"
    elif [ $elapsed -ge $((JB_TIME_LIMIT_S - 90)) ]; then
        status=TIMEOUT; reason="killed at the time limit $JB_TIME_LIMIT (SIG$1 after ${elapsed} s)"
    else
        status=FAILED; reason="cancelled (SIG$1 after ${elapsed} s)"
    fi
    log "$reason"
    finish
    exit 1
}

trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap finish EXIT

if [ "$status" = OK ]; then
    start_samplers
    eval "train_args=($JB_TRAIN_ARGS)"  # shell-quoted by jbprofile.py
    log "launching $JB_WORLD_SIZE rank(s) of $JB_DRIVER on $JB_NODES node(s)"
    if [ "$JB_LAUNCHER" = slurm ]; then
        # shellcheck disable=SC2086
        srun --kill-on-bad-exit=1 --nodes="$JB_NODES" --ntasks="$JB_WORLD_SIZE" \
            --ntasks-per-node="$JB_TASKS_PER_NODE" $JB_SRUN_ARGS \
            $JB_CONTAINER "$PY" -m "$JB_DRIVER" "${JB_DRIVER_COMMAND:-train}" "${train_args[@]}" --out-dir "$out" &
    else
        # shellcheck disable=SC2086
        $JB_CONTAINER "$PY" -m "$JB_DRIVER" "${JB_DRIVER_COMMAND:-train}" "${train_args[@]}" --out-dir "$out" &
    fi
    ranks_pid=$!
    wait "$ranks_pid"
    rc=$?
    ranks_pid=""
    if [ $rc -ne 0 ]; then
        status=FAILED; reason="ranks exited with code $rc (see job.err)"
    fi
fi
finish
