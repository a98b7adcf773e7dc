"""What a run was asked to do, resolved once at the program's edge.

    config.py         TrainConfig, its command line and its checks (config_checks.py)
    config_files.py   TOML and DeepSpeed JSON config files, mapped onto the flags
    batch_rule.py     the batch sizes: G = b x M x N
    shape.py          the RunShape: the typed run (precision, overlap, grouping, ...) a run and its
                      plan share; nothing below the program sees a flag
    grouping.py       --shard-group and --hpz resolved against the node map
    agreement.py      every rank runs the same training, or one line names the difference
    before_mpi.py     what is read before MPI starts (--device, --collective-timeout)
    device_choice.py  --device: the device chosen (the GPU before MPI starts), and what it cannot do
    environment.py    the variables read; launch.py: launcher and thread checks
    output_paths.py   no output overwrites an input; errors.py: ArgumentError; version.py: --version
"""
