"""--quant-error (zerompi/quantize/error.py) measures what the reference says qwZ and qgZ cost: in
the first step, the relative L2 error of the gathered weights is that of the initial weights through
the formula's blocks, and the error of the reduced gradient that of the sum of every rank's
contribution (at the weights the layers saw) through the blocks (each node's sum once more with
two hops) against the exact sum,
both written out in tests/proofs/reference.py. Measuring changes nothing: the weights are bitwise
those of the run that does not measure, and so is every count but the exact calls' own purpose.
Run with N = 1, 2, 3, 4, 8 (on in-process ranks; under mpirun at N = 1, 2)."""
import numpy as np
import pytest

from helpers import consolidated, make_batches, micro_batches_for, train_zero
from reference import initial_weights, loss_and_grads, reduced_through_blocks, through_blocks
from test_quantized_gradients_equal_adamw_on_what_they_reduce import INT4, node_sizes
from test_quantized_weights_equal_adamw_on_what_they_gather import BLOCK, N, QUANTIZER
from test_zero_equals_single_process_adamw import SIZES
from zerompi.hierarchy import FLAT, Grouping
from zerompi.quantize import QUANT_ERROR


def relative(approx, exact):
    return np.sqrt(sum(np.sum((a - e) ** 2) for a, e in zip(approx, exact)) / sum(np.sum(e ** 2) for e in exact))


@pytest.mark.in_process
@pytest.mark.mpi
@pytest.mark.parametrize("stage, grouping, grads, two_hops", [(3, FLAT, QUANTIZER, False), (3, FLAT, INT4, False),
                                                              (3, Grouping(hpz_node_size=1), INT4, False),
                                                              (2, FLAT, QUANTIZER, True)],
                         ids=["qwz-qgz", "qwz-qgz-int4", "hpz-qwz-qgz-int4", "stage2-qgz-two-hops"])
def test_the_first_steps_errors_are_the_references(stage, grouping, grads, two_hops):
    sizes = SIZES[1]
    if two_hops and not node_sizes():
        pytest.skip(f"no node size between 1 and N = {N} divides it")
    node_size = node_sizes()[0] if two_hops else None
    batches = make_batches(sizes, 1)
    weights = QUANTIZER if stage == 3 else None
    engine, _ = train_zero(stage, sizes, np.float64, batches, grouping=grouping, quantizer=weights,
                           grads_quantizer=grads, grads_node_size=node_size, quant_error=True)
    (e_w, e_g), = engine.stage.collectives.error.steps
    layers = initial_weights(sizes, 0)
    params = [p for layer in layers for p in layer]
    if weights is None:
        assert e_w is None
    else:
        assert e_w == pytest.approx(relative(through_blocks(params, N, 8, BLOCK), params), rel=1e-9)
    seen = through_blocks(params, N, 8, BLOCK) if weights else params          # what backward computes with
    seen_layers, (x, labels) = list(zip(seen[::2], seen[1::2])), batches[0]
    exact = [g for layer in loss_and_grads(seen_layers, x, labels)[1] for g in layer]
    reduced = reduced_through_blocks(seen_layers, x, labels, lambda g: g, N, 1, grads.bits, BLOCK, node_size)
    assert e_g == pytest.approx(relative(reduced, exact), rel=1e-9)
    assert e_g > (0.01 if grads.bits == 4 else 0.0005) or N == 1 and grads.bits == 8


@pytest.mark.in_process
@pytest.mark.mpi
def test_measuring_changes_no_weight_and_no_count_but_its_own():
    sizes, batches = SIZES[0], make_batches(SIZES[0], 3)
    runs = [train_zero(3, sizes, np.float32, batches, micro_batches=micro_batches_for(N), quantizer=QUANTIZER,
                       grads_quantizer=INT4, quant_error=error)[0] for error in (False, True)]
    for (w, b), (w_e, b_e) in zip(*(consolidated(engine) for engine in runs)):
        assert np.array_equal(w, w_e) and np.array_equal(b, b_e)
    plain, measured = (dict(engine.comm.ledger.entries) for engine in runs)
    exact_calls = {key: value for key, value in measured.items() if key[1] == QUANT_ERROR}
    assert exact_calls and {k: v[:3] for k, v in measured.items() if k[1] != QUANT_ERROR} == \
        {k: v[:3] for k, v in plain.items()}


@pytest.mark.in_process
@pytest.mark.mpi
def test_a_step_whose_gradient_overflowed_has_no_gradient_error_and_the_summary_skips_it():
    """fp16 with a loss scale that overflows the first step's gradients: qgZ's block turns NaN, the
    exact sum inf, and the step's gradient error is None (not a NaN for --metrics to choke on);
    the weights' error is still measured, and the report's mean is over the steps that have one."""
    from zerompi.train.outputs.report import error_summary
    sizes, batches = SIZES[0], make_batches(SIZES[0], 2)
    engine, results = train_zero(3, sizes, np.float16, batches, loss_scale=2.0 ** 40, quantizer=QUANTIZER,
                                 grads_quantizer=INT4, quant_error=True)
    assert not results[0].applied
    error = engine.stage.collectives.error
    assert [e_g for _, e_g in error.steps] == [None, None] and all(0 < e_w < 0.05 for e_w, _ in error.steps)
    error.steps.append((0.01, 0.2))
    summary = error_summary(error)
    assert summary["grads"] == {"mean": 0.2, "max": 0.2, "steps": 1} and summary["weights"]["steps"] == 3
