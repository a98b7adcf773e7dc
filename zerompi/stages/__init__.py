"""The four ZeRO stages, to be read in order: base.py, then stage0.py -> stage1.py -> stage2.py -> stage3.py.

Each stage derives from ZeroStage (base.py) and writes out the same hooks of the training step
(zerompi/step.py); each differs from the one before in one thing it partitions: the optimizer
state (1), the gradients (2), the parameters (3). docs/stage-diffs.md shows the differences line
by line; `python -m zerompi.memory --formulas` the memory and collectives of each.
"""
from .stage0 import Stage0
from .stage1 import Stage1
from .stage2 import Stage2
from .stage3 import Stage3

STAGES = {0: Stage0, 1: Stage1, 2: Stage2, 3: Stage3}
