"""The commands beside training, each the command-line half of a reference module.

    dry_run.py        python -m zerompi.train --dry-run: the plan of a run (zerompi/plan/)
    plan.py           python -m zerompi.plan: which stage fits, and how fast; cost.py: the cost
                      model; calibrate.py: this machine's limits
    memory_table.py   python -m zerompi.memory: the formulas of zerompi/memory/ as tables
    checkpoint.py     python -m zerompi.checkpoint: inspect, consolidate, export
"""
