"""`python -m zerompi.plan`: a door into the program, zerompi/train/commands/plan.py."""
from ..train.commands.plan import command

raise SystemExit(command())
