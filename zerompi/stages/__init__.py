"""The four ZeRO stages, to be read in order: base.py, then stage0.py -> stage1.py -> stage2.py -> stage3.py.

Each stage derives from ZeroStage (base.py) and writes out the same hooks of the training step
(zerompi/step.py); each differs from the one before in one thing it partitions
(docs/stage-diffs.md shows the differences line by line):

    stage   persistent per rank (elements)          collectives per step
    0       params Psi, grads Psi, Adam 2 Psi       all-reduce grads
    1       params Psi, grads Psi, Adam 2 Psi / N   reduce-scatter grads, all-gather params
    2       params Psi, grads Psi / N, Adam 2 Psi/N reduce-scatter each layer's grads in backward,
                                                    all-gather params
    3       params Psi / N, grads Psi / N, Adam ... all-gather a layer's params before its forward
                                                    and again before its backward, reduce-scatter
                                                    its grads right after its backward
"""
from .stage0 import Stage0
from .stage1 import Stage1
from .stage2 import Stage2
from .stage3 import Stage3

STAGES = {0: Stage0, 1: Stage1, 2: Stage2, 3: Stage3}
