"""What every command shares: exit codes, one-line errors, the argument
parser that raises instead of printing usage, a config file told from
overrides, a run-directory argument checked, and the signal handlers that
stop a run after its current step."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path

from attn.config.loading import as_number, check_run_name, integer_problem
from attn.config.schema import all_keys
from attn.config.yamlio import ArgumentError, ConfigError, show_value, truncate
from attn.store import runs
from attn.train.loop import StopFlag

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 1, 2, 3
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}


class UsageError(Exception):
    """Bad command-line usage; one line."""


def one_line(text: str) -> str:
    """A message as one line: a newline or other unprintable character that
    came with a path or an argument is shown escaped (`\\n`), not printed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def terminal_text(text: str) -> str:
    """Text that a terminal shows as it is and obeys in nothing: every character that is not printable
    but a newline or a tab (ESC, which starts a title, clear-screen or colour sequence; a carriage return;
    C1 controls; the bidirectional overrides, U+202E) shown escaped (`\\x1b`, `\\u202e`). The names of
    runs and directories it carries come from anyone's disk."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def say(*values, file=None, end: str = "\n", flush: bool = False) -> None:
    """print(), every character escaped as terminal_text escapes it: the one way attn/cli writes to stdout
    and stderr (file None: stdout)."""
    print(terminal_text(" ".join(map(str, values))), file=sys.stdout if file is None else file, end=end, flush=flush)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    """[CONFIG] key=value ...: the first item is the config file unless it has an '='."""
    if items and "=" not in items[0]:
        if items[0] in all_keys() and not Path(items[0]).exists():
            raise ConfigError(f"{items[0]}: no such config file; to set that field, write {items[0]}=VALUE")
        return items[0], items[1:]
    return None, items


def install_stop_handlers(stop: StopFlag, second_stops_at_once: bool = True):
    """SIGINT/SIGTERM: the first asks the run to stop after the current step,
    with a checkpoint; a second stops it at once (KeyboardInterrupt), or with
    `second_stops_at_once` false is ignored. Returns a function that puts the
    previous handlers back."""

    def handler(signum, _frame):
        if not stop.reason:
            stop.request(signal.Signals(signum).name)
        elif second_stops_at_once:
            raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}

    def restore():
        for signum, old in previous.items():
            signal.signal(signum, signal.SIG_DFL if old is None else old)

    return restore


def run_dir_argument(text: str, what: str) -> Path:
    """A RUN_DIR argument: its last component a valid run name (config.check_run_name),
    a directory holding config.yaml; else one line, before anything is touched."""
    run_dir = Path(text)
    name = Path(os.path.abspath(text)).name if text else text  # `.` is the directory it stands for
    check_run_name(name, f"{what} {show_value(text)}: the run directory's name")
    if not (run_dir / "config.yaml").is_file():
        reason = runs.not_a_run(run_dir)
        expected = "; expected a directory such as runs/<name>" if reason == runs.NOT_A_RUN else ""
        raise ConfigError(f"{what} {show_value(text)}: {reason}{expected}")
    return run_dir


@contextlib.contextmanager
def flagged(flags: dict[str, str]):
    """Errors about a library call's arguments (ArgumentError) named by the flags that give them."""
    try:
        yield
    except ArgumentError as err:
        raise ConfigError(err.named(flags.get(err.argument, err.argument))) from None


THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what BLAS reads as numpy loads


def training_threads(run_dir: Path | None = None):
    """The BLAS threads a run trains with from the command line: one, as a sweep's workers train, unless the
    environment asks for others (THREAD_VARIABLES); a run continued (`run_dir`: resumed, forked) takes those
    its provenance records, so that it goes on bit for bit. The products are small: with the cores busy
    elsewhere, a second BLAS thread that spins for a core it cannot get can slow a step, and the
    thread count moves a run's bits, so `attn train` of a cell is that cell of a sweep, bit for bit."""
    if any(os.environ.get(variable) for variable in THREAD_VARIABLES):
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    recorded = None
    if run_dir is not None:
        with contextlib.suppress(runs.RunError, OSError):  # an unreadable config is the resume's to refuse
            recorded = (runs.read_run_config(run_dir).get("provenance") or {}).get("blas_threads")
    threads = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1 else 1
    return threadpool_limits(limits=threads, user_api="blas")


def is_interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def number_where(accepted, expected: str):
    """An argparse type: a float for which accepted(value) holds, else one line saying what is `expected`."""

    def parse(text: str) -> float:
        value = as_number(text)
        if value is None or not accepted(value):
            raise argparse.ArgumentTypeError(f"got {truncate(repr(text))}; expected {expected}")
        return value

    return parse


def integer_at_least(minimum: int):
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or len(text) > 20 or integer_problem(int(text), ge=minimum):
            raise argparse.ArgumentTypeError(f"got {truncate(repr(text))}; expected {integer_problem(-1, ge=minimum)}")
        return int(text)

    return parse
