# Shared by the batch scripts in this folder (sourced, not run): a check of the environment,
# per-job folders, BLAS threads, and preemption with requeue. The calling script sets LAUNCH, an
# array holding its launcher (e.g. `srun --mpi=pmi2 --kill-on-bad-exit=1`), then calls
# `zerompi_run [train flags...]`.
#
# Before launching any rank, the batch host checks that "$ZEROMPI_PYTHON" imports zerompi: where it
# does not (the environment was not active at sbatch), one line says what to do, and the job ends
# with status 2, instead of every rank printing the same traceback.
#
# Per-job folder: runs/<job name>-<job id>/ under the submit directory (ZEROMPI_RUN_ROOT changes
# the root, ZEROMPI_RUN_DIR the folder itself). A requeued job keeps its job id, so it finds its
# own checkpoints there and resumes. A folder this job created and the run left with nothing but
# its log (bad input: zerompi writes nothing) is removed at the end; the log is in Slurm's output.
#
# Preemption: the scripts ask Slurm for `--signal=B:USR1@<seconds>`: before the time limit (or
# when `scancel --signal=USR1 --batch <job>` says so), this batch shell gets SIGUSR1. It passes the
# signal on to the ranks through the launcher (again every 10 s, in case the launcher had not
# started its tasks yet); every rank finishes its step, zerompi writes a checkpoint and exits
# with status 4; the script then requeues the job, which resumes with --resume once Slurm's
# requeue delay has passed (AuthInfo=cred_expire in slurm.conf, 120 s by default).
# A plain `scancel <job>` (SIGTERM) also makes zerompi checkpoint and exit, but is not requeued.

ZEROMPI_PYTHON=${ZEROMPI_PYTHON:-python3}        # SITE: the python of the env where zerompi is installed
run_dir=${ZEROMPI_RUN_DIR:-${ZEROMPI_RUN_ROOT:-$SLURM_SUBMIT_DIR/runs}/$SLURM_JOB_NAME-$SLURM_JOB_ID}

# One BLAS/OpenMP thread per CPU Slurm gave each task (zerompi reads OMP_NUM_THREADS); since
# Slurm 22.05, srun no longer inherits --cpus-per-task from sbatch: pass it on explicitly.
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS MKL_NUM_THREADS=$OMP_NUM_THREADS
export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}

launcher_pid=
resender_pid=
preempted=0
cancelled=0

forward() {                                      # forward a signal to the ranks, now and every 10 s
    local sig=$1
    echo "$(date -Is) job $SLURM_JOB_ID: SIG$sig: asking the ranks to checkpoint" >&2
    if [ -n "$launcher_pid" ]; then
        kill -"$sig" "$launcher_pid" 2>/dev/null || true
        if [ -z "$resender_pid" ]; then
            ( while kill -0 "$launcher_pid" 2>/dev/null; do
                  sleep 10; kill -"$sig" "$launcher_pid" 2>/dev/null || true
              done ) &
            resender_pid=$!
        fi
    fi
}

check_python() {                                 # one line and status 2 where zerompi does not import
    local problem
    if ! problem=$("$ZEROMPI_PYTHON" -c 'import zerompi.train.loop.run' 2>&1); then
        echo "zerompi: error: $ZEROMPI_PYTHON cannot import zerompi ($(tail -n 1 <<< "$problem")): activate" \
             "the venv that has zerompi before sbatch (sbatch passes it on), or set ZEROMPI_PYTHON to its python" >&2
        exit 2
    fi
}

make_run_dir() {                                 # made_dir: the outermost folder this job creates
    local folder=$run_dir
    made_dir=
    while [ ! -d "$folder" ]; do made_dir=$folder; folder=$(dirname "$folder"); done
    mkdir -p "$run_dir"
}

remove_if_empty() {                              # what make_run_dir made, if the run left only its log there
    [ -n "$made_dir" ] && [ "$(ls -A "$run_dir")" = train.log ] || return 0
    rm -f "$run_dir/train.log"
    local folder=$run_dir                         # rmdir: never a folder that holds anything
    while rmdir "$folder" 2>/dev/null && [ "$folder" != "$made_dir" ]; do folder=$(dirname "$folder"); done
    echo "$(date -Is) job $SLURM_JOB_ID: the run wrote nothing; removed $made_dir" >&2
}

zerompi_run() {
    check_python
    make_run_dir
    echo "$(date -Is) job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST: $run_dir" >&2
    trap 'preempted=1; forward USR1' USR1        # --signal=B:USR1: checkpoint, then requeue
    trap 'cancelled=1; forward TERM' TERM        # scancel: checkpoint, no requeue
    # the tee processes ignore the signals, so that they log the ranks' last lines too
    "${LAUNCH[@]}" "$ZEROMPI_PYTHON" -m zerompi.train \
        --save-dir "$run_dir/checkpoints" --resume --save-weights "$run_dir/final.npz" "$@" \
        > >(trap '' TERM USR1; exec tee -a "$run_dir/train.log") \
        2> >(trap '' TERM USR1; exec tee -a "$run_dir/train.log" >&2) &
    launcher_pid=$!
    while kill -0 "$launcher_pid" 2>/dev/null; do   # `wait` returns early whenever a trap runs
        wait "$launcher_pid" || true
    done
    status=0
    wait "$launcher_pid" || status=$?                # bash keeps a reaped child's status
    [ -n "$resender_pid" ] && kill "$resender_pid" 2>/dev/null
    wait 2>/dev/null || true                         # the tee processes: every line is in the log
    if [ "$preempted" = 1 ] && [ "$cancelled" = 0 ] && [ "$status" = 4 ]; then
        echo "$(date -Is) job $SLURM_JOB_ID: checkpoint written; requeueing: it resumes after Slurm's requeue" \
             "delay (AuthInfo=cred_expire in slurm.conf, 120 s by default; squeue shows reason BeginTime)" >&2
        scontrol requeue "$SLURM_JOB_ID" || { echo "scontrol requeue failed: resubmit with --resume" >&2; exit 4; }
        exit 0
    fi
    remove_if_empty
    exit "$status"
}
