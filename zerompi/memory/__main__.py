"""`python -m zerompi.memory`: the tables of zerompi/memory/table.py."""
from .table import main

raise SystemExit(main())
