#!/bin/sh
# The memory preflight (docs/planning.md): each rank capped at 3 GB of address space, an MLP of
# 202 million parameters on 4 ranks. Stage 0 is refused before anything is allocated, with one
# line naming the stages that fit; stage 3 trains.
#
#     sh examples/memory_preflight.sh        (in the repository's environment; ~30 s on 2 cores)
ulimit -v 3000000
for stage in 0 3; do
    echo "--- ulimit -v 3000000; mpirun -n 4 python -m zerompi.train --stage $stage --hidden 8192,8192,8192,8192 --steps 2 --batch-size 64"
    mpirun -n 4 python -m zerompi.train --stage "$stage" --hidden 8192,8192,8192,8192 --steps 2 --batch-size 64 \
        --report none
    echo "exit status $?"
done
