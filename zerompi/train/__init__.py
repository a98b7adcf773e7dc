"""The command-line program around the ZeRO core: `mpirun -n N python -m zerompi.train`.

    run.py           setup, the training loop, the finish (held-out accuracy, weights, report)
    config.py        TrainConfig, its command line and its checks; config_files.py: TOML and
                     DeepSpeed JSON; environment.py: the variables read; version.py: --version
    batch_rule.py    the batch sizes: G = b x M x N  output_paths.py no output overwrites an input
    errors.py        ArgumentError: a bad command line, one line
    data.py          data sets (the shipped digits in datasets/, synthetic, .npz) and batch order
    batches.py       this rank's rows of each micro-batch, gathered on the device
    schedule.py      learning-rate schedule           loss_scale.py   fp16 dynamic loss scaling
    divergence.py    the stop on a diverged run       launch.py       launcher and thread checks
    progress.py      the progress line                status_line.py  the live progress line (tqdm)
    destination.py   where --progress auto draws it   tensorboard.py  --tensorboard event files
    metrics.py       per-step records, JSON lines     report.py       the end-of-run ledger report
    signals.py       SIGINT, SIGTERM, SIGUSR1: a checkpoint and exit, or the end of the run
"""
