"""`python -m zerompi.checkpoint`: a door into the program, zerompi/train/commands/checkpoint.py."""
from ..train.commands.checkpoint import main

raise SystemExit(main())
