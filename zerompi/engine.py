"""Assembling a run: layout, ledgers, the ZeRO stage and the MLP's activations, on one rank.

    layout  = Layout(sizes, N)              where each layer lives (zerompi/layout.py)
    memory  = MemoryLedger(comm.device)     every buffer below is allocated through it, on the
                                            communicator's device (NumPy or CuPy, zerompi/devices/device.py)
    zero    = STAGES[stage](layout, ...)    parameters, gradients, Adam state, collectives
    mlp     = MLP(layout, batch_rows, ...)  activation buffers for this rank's rows of a micro-batch
"""
from dataclasses import dataclass

from .comm import Communicator
from .layout import Layout
from .ledger import MemoryLedger
from .model import MLP, init_layer_values
from .overlap import OverlapConfig
from .stages import STAGES


@dataclass
class Engine:
    layout: Layout
    comm: Communicator
    memory: MemoryLedger
    zero: object        # a Stage0 .. Stage3
    mlp: MLP

    def init_params(self, seed):
        """Every rank draws the same initial values, one layer at a time, and keeps what its stage keeps."""
        for layer in self.layout.layers:
            self.zero.set_layer_params(layer, init_layer_values(layer, seed))


def build_engine(sizes, stage, precision, adam_config, batch_rows, comm=None, micro_batches=1,
                 overlap=OverlapConfig()):
    comm = comm if comm is not None else Communicator()
    layout = Layout(sizes, comm.size)
    memory = MemoryLedger(comm.device)
    zero = STAGES[stage](layout, comm, memory, precision, adam_config, micro_batches, overlap)
    mlp = MLP(layout, batch_rows, precision, memory, micro_batches)
    return Engine(layout, comm, memory, zero, mlp)
