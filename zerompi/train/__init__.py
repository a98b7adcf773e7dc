"""The program: `mpirun -n N python -m zerompi.train` and the commands beside it, around the
reference (the ZeRO core and its layers, which import nothing from here).

Grouped by the question a reader brings:

    options/    what was asked: the command line, config files (TOML, DeepSpeed JSON), the
                batch rule, the checks, the RunShape a run and its plan share, ranks that agree
    loop/       the run and its policies: run.py (setup, loop, finish), the data and the batches
                of each step, the learning-rate schedule, loss scaling, divergence, signals,
                when checkpoints are written and which one a run resumes, the --save-dir lock
    outputs/    what a run prints and writes: the header, progress and the live line, per-step
                metrics and TensorBoard, the end-of-run report
    commands/   the other commands: --dry-run, `python -m zerompi.plan` (cost model,
                calibration), `python -m zerompi.memory`, `python -m zerompi.checkpoint`
    datasets/   the shipped digits
"""
