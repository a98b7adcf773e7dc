"""Observability and guards around the ZeRO core (a reader of the algorithm can skip them).

    trace.py             --trace: per-rank Chrome trace of compute and communication spans
    guards.py            the two guards below, around every collective of zerompi/comm.py
    collective_check.py  --check-collectives: every rank calls the same collective, or a clean stop
    watchdog.py          --collective-timeout: end a job whose collective waits too long

Built on by overlap/ (the call sites the check names) and the program (`guards_for`).
"""
from .collective_check import CollectiveCheck, call_site
from .guards import Guards, guards_for

__all__ = ["CollectiveCheck", "Guards", "call_site", "guards_for"]
