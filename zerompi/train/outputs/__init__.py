"""What a run prints and writes.

    header.py        the lines at the start           report.py       the end-of-run ledger report
    progress.py      the progress line                status_line.py  the live progress line (tqdm)
    destination.py   where --progress auto draws it   metrics.py      per-step records, JSON lines
    tensorboard.py   --tensorboard event files
"""
