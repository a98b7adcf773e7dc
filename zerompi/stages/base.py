"""What every stage shares: the hooks of the training step and the replicated parameters.

The training step (zerompi/train_step.py) calls, for each unit (one linear layer):

    weight, bias = zero.before_forward(unit)                     ...forward...   zero.after_forward(unit)
    weight, bias, dweight, dbias = zero.before_backward(unit)    ...backward...  zero.after_backward(unit)

and then zero.step() once. A stage decides where those arrays live and which collectives run when.

Each stage is a small step from the one before and is written as one: Stage1 extends Stage0,
Stage2 extends Stage1, Stage3 extends Stage2, each overriding only the hooks that change. Every
stage's constructor lists all the buffers that stage holds (so it calls ZeroStage.__init__,
not its parent's constructor, which would allocate the parent's buffers).

Stages 0, 1 and 2 keep the full parameters on every rank, in one flat buffer `param_full`
(Psi_pad elements, see zerompi/layout.py); the methods below serve them. Stage 3 keeps only its
shard and overrides them.
"""


class ZeroStage:
    stage = None

    def __init__(self, layout, comm, memory, dtype, adam_config):
        self.layout = layout          # where every unit lives in the flat buffers
        self.comm = comm              # the ledgered communicator
        self.memory = memory          # the memory ledger every buffer is allocated from
        self.dtype = dtype
        self.adam_config = adam_config

    def set_unit_params(self, unit, values):
        """Load the unit's real elements, values (numel,), the same on every rank."""
        self.param_full[unit.full_offset:unit.full_offset + unit.numel] = values

    def full_unit_params(self, unit):
        """The unit's full flat parameters (padded,). Collective in stage 3: call on every rank."""
        return self.param_full[self.layout.full_slice(unit)]

    def before_forward(self, unit):
        return unit.views(self.param_full[self.layout.full_slice(unit)])

    def after_forward(self, unit):
        """Nothing to release by default."""

    def after_backward(self, unit):
        """Nothing to communicate by default."""
