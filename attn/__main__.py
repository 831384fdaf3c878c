"""`python -m attn` and the `attn` console script: attn.cli.main, imported
inside, so that a Ctrl-C while numpy and the rest load (the slow part of a
start on a cold disk) exits as one during a command does: one line, 130."""

import sys

EXIT_SIGINT = 130  # attn.cli.common.EXIT_SIGNAL["SIGINT"], which is what is loading


def entry() -> int:
    try:
        from attn.cli import main as command
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    return command()


if __name__ == "__main__":
    sys.exit(entry())
