"""`python -m zerompi.memory`: a door into the program, zerompi/train/commands/memory_table.py."""
from ..train.commands.memory_table import command

raise SystemExit(command())
