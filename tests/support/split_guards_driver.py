"""Guards on a split communicator, as the hierarchical variants make them (Communicator.split):
run as `mpirun -n 4 python tests/support/split_guards_driver.py KIND` (tests/program/test_hierarchy_cli.py).

    mismatch   --check-collectives; ranks 2 and 3 (one group of two) disagree on a collective of
               their group while ranks 0 and 1 go on to a collective of the whole job
    stop       --collective-timeout 1; rank 3 never joins its group's collective (it sleeps)
"""
import sys
import time

import numpy as np

from zerompi.comm import Communicator
from zerompi.observe import guards_for
from zerompi.ledger import GRADS

kind = sys.argv[1]
world = Communicator(guards=guards_for(check_collectives=kind == "mismatch",
                                       collective_timeout=1.0 if kind == "stop" else 0.0))
group = world.split(lambda rank: rank // 2)     # ranks {0, 1} and {2, 3}
if kind == "mismatch" and world.rank >= 2:
    group.allreduce_sum(np.zeros(10 if world.rank == 2 else 12), GRADS)
if kind == "stop":
    if world.rank == 3:
        time.sleep(60)
    group.allreduce_sum(np.zeros(10), GRADS)
world.allreduce_sum(np.zeros(4), GRADS)
print(f"rank {world.rank} went past the collectives", flush=True)
