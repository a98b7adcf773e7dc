"""The run and its policies.

    run.py           setup, the training loop, the finish (held-out accuracy, weights, report)
    data.py          data sets (the shipped digits, synthetic, .npz)
    batches.py       which rows make each step's global batch, and this rank's rows of each micro-batch
    schedule.py      the learning-rate schedule       loss_scale.py   fp16 dynamic loss scaling
    divergence.py    the stop on a diverged run       signals.py      SIGINT, SIGTERM, SIGUSR1
    end_job.py       ending every rank with one line
    checkpoints.py   when checkpoints are written, which one a run resumes (the format: zerompi/checkpoint/)
    lock.py          one run per --save-dir
"""
