# Shared by the batch scripts in this folder (sourced, not run): per-job folders, BLAS threads,
# and preemption with requeue. The calling script sets LAUNCH, an array holding its launcher
# (e.g. `srun --mpi=pmi2`), then calls `zerompi_run [train flags...]`.
#
# Per-job folder: runs/<job name>-<job id>/ under the submit directory (ZEROMPI_RUN_ROOT changes
# the root). A requeued job keeps its job id, so it finds its own checkpoints there and resumes.
#
# Preemption: the scripts ask Slurm for `--signal=B:USR1@<seconds>`: before the time limit (or
# when `scancel --signal=USR1 --batch <job>` says so), this batch shell gets SIGUSR1. It passes the
# signal on to the ranks through the launcher; every rank finishes its step, zerompi writes a
# checkpoint and exits with status 4; the script then requeues the job, which resumes with --resume.

ZEROMPI_PYTHON=${ZEROMPI_PYTHON:-python3}        # SITE: the python of the env where zerompi is installed
run_dir=${ZEROMPI_RUN_DIR:-${ZEROMPI_RUN_ROOT:-$SLURM_SUBMIT_DIR/runs}/$SLURM_JOB_NAME-$SLURM_JOB_ID}
mkdir -p "$run_dir"

# One BLAS/OpenMP thread per CPU Slurm gave each task (zerompi reads OMP_NUM_THREADS).
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS MKL_NUM_THREADS=$OMP_NUM_THREADS

signalled=0
on_signal() {
    signalled=1
    echo "$(date -Is) job $SLURM_JOB_ID: preemption signal: asking the ranks to checkpoint" >&2
    kill -USR1 "$launcher_pid" 2>/dev/null || true     # srun and mpirun pass it on to every rank
}

zerompi_run() {
    echo "$(date -Is) job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST: $run_dir" >&2
    trap on_signal USR1 TERM
    "${LAUNCH[@]}" "$ZEROMPI_PYTHON" -m zerompi.train \
        --save-dir "$run_dir/checkpoints" --resume --save-weights "$run_dir/final.npz" "$@" \
        > >(tee -a "$run_dir/train.log") 2> >(tee -a "$run_dir/train.log" >&2) &
    launcher_pid=$!
    status=0
    while true; do                                   # `wait` returns early when a trap runs
        wait "$launcher_pid" && status=0 || status=$?
        kill -0 "$launcher_pid" 2>/dev/null || break
    done
    if [ "$signalled" = 1 ] && [ "$status" = 4 ]; then
        echo "$(date -Is) job $SLURM_JOB_ID: checkpoint written; requeueing" >&2
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    exit "$status"
}
