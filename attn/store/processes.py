"""Which process is writing: its pid, host and identity, and whether a pid
is alive. A pid's identity is its boot id and start time, so that a pid
reused after a reboot or by another process is not mistaken for the writer
(attn.store.runs' heartbeat, attn.store.locks' record of the lock's holder).

And the children attn starts (run_child: `attn verify`'s `attn sweep`): each
in its own process group, stopped with its parent: a SIGINT or SIGTERM to
the parent is passed on to the child's group and waited for, and on Linux
the child gets SIGTERM from the kernel (PR_SET_PDEATHSIG) if the parent dies
by SIGKILL; a sweep so signalled checkpoints its runs and stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Callable


def writer_identity() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "process": process_identity(os.getpid())}


def process_identity(pid: int) -> str | None:
    """'<boot id>:<start time in clock ticks>' of a live process on Linux, else None."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    start_ticks = stat.rsplit(")", 1)[1].split()[19]  # field 22 of /proc/<pid>/stat
    return f"{boot_id}:{start_ticks}"


def pid_alive(pid) -> bool:
    """Whether the process runs: it exists and, on Linux, is no zombie (dead, not yet reaped by its parent)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc to ask (not Linux): it exists


# ---------------------------------------------------------------------------
# Child processes: they die with their parent
# ---------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ChildStopped(RuntimeError):
    """The parent was asked to stop (SIGINT/SIGTERM) while a child ran: the
    signal was passed on to the child's process group and the child has
    ended. `signal` is the signal's name; str() is the one-line message."""

    def __init__(self, signal_name: str, returncode: int):
        super().__init__(
            f"stopped by {signal_name} (passed on to the child process, which ended with exit {returncode})"
        )
        self.signal, self.returncode = signal_name, returncode


def die_with(parent: int, signum: int) -> None:
    """In a child (before it runs a command, or a worker as it starts): on
    Linux, ask the kernel for signum when the parent dies (even by SIGKILL);
    if it already has, end now."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


def run_child(
    command: list[str],
    env: dict | None = None,
    stdout=None,
    stderr=None,
    text: bool = True,
    on_death: int = signal.SIGTERM,
    cwd: Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> subprocess.CompletedProcess:
    """Run command as a child in its own process group (a terminal's Ctrl-C
    reaches this process alone) that ends with this one: SIGINT/SIGTERM
    received meanwhile are passed on to the child's group and waited for
    (then ChildStopped); any other exit here (an exception) kills the group;
    and, on Linux, the kernel sends the child `on_death` if this process
    dies without a word (SIGKILL). Returns the finished process, as
    subprocess.run does. `on_line`, with stderr=PIPE (text, stdout not a
    pipe): each line of the child's stderr as it comes, without its newline
    (a long child's progress), all of them returned as well; once it fails
    to pass a line on (OSError: a closed pipe), the rest are only returned."""
    if on_line is not None and (stderr != subprocess.PIPE or stdout == subprocess.PIPE or not text):
        raise ValueError("run_child: on_line reads a text stderr pipe, beside a stdout that is not a pipe")
    parent = os.getpid()
    received: list[int] = []
    started: list[subprocess.Popen] = []  # the child, once Popen has returned
    unsent: list[int] = []  # stops that came before: passed on once it has

    def pass_on(signum):
        for process in started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signum)

    def forward(signum, _frame):
        if os.getpid() != parent:  # the forked child before its exec (die_with): the signal is its own, to end it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.append(signum)
        if started:
            pass_on(signum)
        else:
            unsent.append(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():  # before the child starts: no stop goes unseen
        previous = {signum: signal.signal(signum, forward) for signum in STOP_SIGNALS}
    try:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=stdout,
            stderr=stderr,
            text=text,
            errors="replace" if on_line is not None else None,  # a stray byte never ends the reading, nor the child
            start_new_session=True,
            preexec_fn=functools.partial(die_with, parent, on_death),
            cwd=cwd,
        )
        started.append(process)
        if unsent:
            pass_on(unsent[0])
        try:
            if on_line is None:
                out, err = process.communicate()
            else:
                lines = []
                for line in process.stderr:
                    lines.append(line)
                    if on_line is not None:
                        try:
                            on_line(line.rstrip("\n"))
                        except OSError:  # where the lines go is gone (a closed pipe): the child carries on unheard
                            on_line = None
                out, err = None, "".join(lines)
                process.stderr.close()
                process.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    if received:
        raise ChildStopped(signal.Signals(received[0]).name, process.returncode)
    return subprocess.CompletedProcess(command, process.returncode, out, err)
