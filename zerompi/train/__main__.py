"""`python -m zerompi.train`: the training program (zerompi/train/run.py)."""
from .run import main

raise SystemExit(main())
