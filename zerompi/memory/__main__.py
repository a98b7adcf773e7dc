"""`python -m zerompi.memory`: the tables of zerompi/memory/table.py."""
from ..util.pipes import until_reader_leaves
from .table import main

raise SystemExit(until_reader_leaves(main) or 0)
