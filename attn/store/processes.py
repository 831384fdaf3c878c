"""Which process is writing: its pid, host and identity, and whether a pid
is alive. A pid's identity is its boot id and start time, so that a pid
reused after a reboot or by another process is not mistaken for the writer
(attn.store.runs' heartbeat, attn.store.locks' record of the lock's holder).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


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
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
