"""ArgumentError: a bad command line or config file, raised with its one-line message.

Raised by the parser (config.py) and the batch rule (batch_rule.py) on every rank alike; the
program (zerompi/train/loop/run.py) catches it, prints `zerompi: error: <message> (see --help)` once, and every rank
exits with status 2.
"""


class ArgumentError(Exception):
    """A bad command line; str(e) is the one-line message."""
