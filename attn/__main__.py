"""`python -m attn` and the `attn` console script: attn.cli.main, imported
inside, so that a Ctrl-C while numpy and the rest load (the slow part of a
start on a cold disk) stops attn at once, by the signal, as it stops any
program, and not with a traceback (once loaded, attn.cli handles it)."""

import os
import signal
import sys


def entry() -> int:
    try:
        from attn.cli import main as command
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise  # not reached: the default action of SIGINT ends the process
    return command()


if __name__ == "__main__":
    sys.exit(entry())
