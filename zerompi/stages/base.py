"""What every stage shares: the hooks of the training step, and the optimizer step built on them.

The training step (zerompi/step.py) calls, per micro-batch and per layer (one linear layer):

    zero.start_micro_batch(first, last)
    weight, bias = zero.before_forward(layer)          ...forward...    zero.after_forward(layer)
    weight, bias, dweight, dbias, accumulate = zero.before_backward(layer)
                                                      ...backward...   zero.after_backward(layer)

and then, once per optimizer step:

    zero.reduce_grads()         wait for the gradient reductions that backward started
    zero.grad_partition()       the reduced gradient, each element on exactly one rank (global norm)
    zero.update(lr, multiplier) Adam on what this rank owns
    zero.gather_params()        bring every rank's updated parameters to all ranks (stages 1-2)

A stage decides where those arrays live and which collectives run when. The heart of each stage
is `owned(layer)`: which part of a layer this rank updates, and where its gradient and Adam state are.

Each stage is a small step from the one before and is written as one: Stage1 extends Stage0,
Stage2 extends Stage1, Stage3 extends Stage2, each overriding only what changes. Every stage's
constructor lists all the buffers that stage holds (so it calls ZeroStage.__init__, not its
parent's constructor, which would allocate the parent's buffers).

Collectives go through `self.queue` (zerompi/overlap.py): with overlap on they run on a
communication thread while the main thread computes, and a stage waits for a call's ticket before
it reads or reuses the call's buffers. Anything that reads or writes the parameters from outside
the step (checkpoints, weight files) first finishes all communication in flight.

Stages 0, 1 and 2 keep the full parameters on every rank, in one flat buffer `param_full`
(Psi_pad elements, see zerompi/layout.py); the methods below serve them. Stage 3 keeps only its
shard and overrides them.
"""
import numpy as np

from ..overlap import CommQueue, OverlapConfig, gradient_buckets


class ZeroStage:
    stage = None

    def __init__(self, layout, comm, memory, precision, adam_config, micro_batches=1,
                 overlap=OverlapConfig()):
        self.layout = layout          # where every layer lives in the flat buffers
        self.comm = comm              # the ledgered communicator
        self.memory = memory          # the memory ledger every buffer is allocated from
        self.precision = precision    # storage dtype of params and grads, compute dtype
        self.overlap = overlap        # communication thread on/off, bucket size, prefetch depth
        self.first_micro_batch = self.last_micro_batch = True
        self.param_tickets = {}       # layer index -> ticket of the all-gather bringing its params
        # stages 0-1: gradients handed to communication a bucket (consecutive layers) at a time
        self.buckets = gradient_buckets(layout.layers, np.dtype(precision.storage).itemsize,
                                        overlap.bucket_mb)
        self.bucket_ending_at = {bucket[-1].index: bucket for bucket in self.buckets}
        # the communicator needs staging to reduce 16-bit buffers, to add each micro-batch's
        # reduce-scatter into the gradient shard (stages 2-3), and on a GPU (no in-place
        # reduce-scatter on device memory, see comm.py); otherwise it reduces in place
        if precision.mixed or (micro_batches > 1 and self.stage >= 2) or comm.device.is_gpu:
            comm.reserve_staging(memory, self.largest_reduction(), precision.compute)
        # the step's (each layer's gradient sum of squares, loss, correct), all-reduced together (train_step.py)
        self.step_sums = memory.alloc("work", "step_sums", (len(layout.layers) + 2,), np.float64)
        # every collective on training buffers moves at most the largest reduction (in the
        # compute dtype), or the step's sums
        comm.reserve_host_staging(memory, max(self.largest_reduction() * precision.compute.itemsize,
                                              self.step_sums.nbytes))
        self.queue = CommQueue(comm, overlap.enabled)    # after the staging: its thread shares it

    def alloc_layer_buffers(self, name, count):
        """count one-layer work buffers in the storage dtype, ledgered as name, name.2, name.3, ..."""
        return [self.memory.alloc("work", name + ("" if i == 0 else f".{i + 1}"),
                                  (self.layout.max_layer_padded,), self.precision.storage)
                for i in range(count)]

    def largest_reduction(self):
        """Elements of the largest buffer reduced in one call: one layer (stage 0 overrides)."""
        return self.layout.max_layer_padded

    def finish_communication(self):
        """Wait for every collective in flight (before the parameters are read or written from
        outside the training step, and before Adam)."""
        self.queue.wait_all()
        self.param_tickets.clear()

    # ---- parameters (replicated in stages 0-2)
    def store_layer_params(self, layer, values):
        """Write the layer's real elements, values (numel,), the same on every rank."""
        self.finish_communication()
        self.param_full[layer.full_offset:layer.full_offset + layer.numel] = values

    def set_layer_params(self, layer, values):
        """Initial or loaded parameters, values (numel,) float64, the same on every rank; in mixed
        precision the fp32 master copy of the owned part too, and the 16-bit parameters rounded
        from that master (so that params == round(master) always, as after every Adam step)."""
        values = self.memory.device.from_numpy(values.astype(self.precision.compute))
        self.store_layer_params(layer, values)
        if self.adam.master is not None:
            _, _, state, (lo, hi) = self.owned(layer)
            owned_values = values[lo:hi]               # shorter than the shard where it reaches padding
            self.adam.master[state][:owned_values.size] = owned_values

    def held_params(self, layer):
        """(the layer's parameters this rank holds, (lo, hi): which elements of the layer they are)."""
        self.finish_communication()
        return self.param_full[self.layout.full_slice(layer)], (0, layer.padded)

    def full_layer_params(self, layer):
        """The layer's full flat parameters (padded,). Collective in stage 3: call on every rank."""
        self.finish_communication()
        return self.param_full[self.layout.full_slice(layer)]

    # ---- the hooks of forward and backward
    def start_micro_batch(self, first, last=True):
        """first: the step's first micro-batch overwrites gradients, later ones add to them;
        last: stages 0-1 reduce the gradients during the last micro-batch's backward."""
        self.first_micro_batch, self.last_micro_batch = first, last

    def before_forward(self, layer):
        self.queue.wait(self.param_tickets.pop(layer.index, None))   # its all-gather (stages 1-2)
        return layer.views(self.param_full[self.layout.full_slice(layer)])

    def params_for_backward(self, layer):
        """(weight, bias) for the layer's backward: the same as its forward's (stage 3 overrides)."""
        return self.before_forward(layer)

    def after_forward(self, layer):
        """Nothing to release by default."""

    def after_backward(self, layer):
        """Nothing to communicate by default."""

    # ---- the optimizer step
    def reduce_grads(self):
        """Wait for the gradient reductions that backward started."""
        self.queue.wait_all()

    def grad_partition(self):
        """The reduced gradient, each element on exactly one rank: what this rank owns."""
        return [self.owned(layer)[1] for layer in self.layout.layers]

    def update(self, lr, grad_multiplier):
        self.finish_communication()
        self.adam.begin_step()
        tracer = self.comm.tracer                 # None unless --trace (zerompi/observe/trace.py)
        for layer in self.layout.layers:
            param, grad, state, _ = self.owned(layer)
            start = tracer and tracer.now()
            self.adam.update(param, grad, state, lr, grad_multiplier)
            if tracer:
                tracer.span(f"adam {layer.index}", "compute", start, layer=layer.index, elements=param.size)

    def gather_params(self):
        """Nothing to gather by default."""
