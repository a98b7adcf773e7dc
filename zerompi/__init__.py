"""zerompi: a readable reference implementation of ZeRO stages 0-3 over MPI (see README.md)."""
__version__ = "0.1.0"
