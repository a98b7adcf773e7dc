"""Printing into a pipe whose reader has gone (`python -m zerompi.plan ... | head -3`): the reader
has what it wanted, so the program ends with status 0 and no traceback (Python ignores SIGPIPE,
so a write to that pipe raises BrokenPipeError, and so would the flush at exit)."""
import os
import sys


def until_reader_leaves(print_all):
    """Call print_all(); if the reader of stdout has gone, stop there quietly. Returns its result,
    or None."""
    try:
        return print_all()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nothing left to flush at exit
        return None
