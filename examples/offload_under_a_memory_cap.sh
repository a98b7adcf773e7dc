#!/bin/sh
# ZeRO-Infinity on one machine (docs/offload.md): each rank capped at 990 MB of address space, an
# MLP of 51 million parameters on 2 ranks. In memory, stage 3 is refused by the preflight before
# anything is allocated; with --offload-optimizer file (m and v in a scratch file per rank) it
# trains, prints its bytes per tier, and saves the same weights, bit for bit, as the run without
# the cap and without offload.
#
#     sh examples/offload_under_a_memory_cap.sh [FOLDER]   (default ./offload-demo; ~1 min on 2 cores)
work=${1:-offload-demo}
export OMP_NUM_THREADS=1    # one BLAS thread per rank: what a rank maps does not grow with the cores
mkdir -p "$work/offload" || exit 1
set -- --stage 3 --hidden 4096,4096,4096,4096 --steps 2 --batch-size 32
echo "--- mpirun -n 2 python -m zerompi.train $*   (no cap, in memory)"
mpirun -n 2 python -m zerompi.train "$@" --report none --save-weights "$work/in_memory.npz" || exit 1
ulimit -v 990000
echo "--- ulimit -v 990000; the same, in memory"
mpirun -n 2 python -m zerompi.train "$@" --report none
echo "exit status $?"
echo "--- ulimit -v 990000; the same with --offload-optimizer file --offload-dir $work/offload"
mpirun -n 2 python -m zerompi.train "$@" --offload-optimizer file --offload-dir "$work/offload" \
    --save-weights "$work/offloaded.npz" || exit 1
python -c "
import sys, numpy as np
a, b = np.load(sys.argv[1] + '/in_memory.npz'), np.load(sys.argv[1] + '/offloaded.npz')
same = sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
print('the weights are bit for bit the same' if same else 'the weights DIFFER')
sys.exit(0 if same else 1)" "$work"
