"""One writer per run directory, and whether a run's writer is alive.

Every process that writes a run directory holds its RunLock (an flock on
<directory>/.lock); liveness is read from that lock where the file system
shares it, else from the heartbeat in summary.json (effective_status).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

from attn.store.processes import pid_alive, process_identity, writer_identity
from attn.store.runs import RunError, describe_os_error, is_finite_number

LOCK_NAME = ".lock"
LOCK_GRACE_SECONDS = 0.2  # a writer retries this long: a status probe holds the lock for microseconds
STALE_AFTER_SECONDS = 120.0  # a `running` run whose heartbeat is older than this is stale


class RunLocked(RunError):
    """The directory's RunLock is held by another writer, named in `holder`."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


class RunLock:
    """The exclusive write lock of a run directory (or of an experiment
    directory, for its report): an flock on <directory>/.lock.

        with locks.RunLock(run_dir, "train --resume"):
            ...look at the run's state, then write it...

    Contract:
    - Every writer of the directory holds it: train (fresh and resumed), a
      sweep's cell, figure writers (plot), an experiment's report writer. A
      writer takes it *before* it reads the state it acts on (is the run
      finished? running? resumable?), so checking and claiming are one step.
    - Never waits: if another process holds it, entering raises RunLocked
      (a RunError) at once, one line naming the holder's purpose, pid and
      host; the holder's record is in the lock file while it holds it.
      (Entering retries for LOCK_GRACE_SECONDS first, as a status probe,
      is_locked, holds the lock for a moment.)
    - Re-entrant within a thread: a block nested in one holding the same
      directory's lock passes through (a run's figures inside its training).
      Another thread of the same process is refused like another process,
      so two cells of one Dask worker never share a run.
    - The kernel releases it when its holder dies (SIGKILL, a lost worker):
      a dead writer never blocks its run, and liveness is read from the lock
      (effective_status) rather than guessed from a pid.
    - It refuses a directory that is a symbolic link or not a directory
      (RunError): attn writes only into the directory it names.
    - Across hosts it is as good as the file system's flock (local disks
      and NFSv4 share it); where locks are not shared, summary.json's
      heartbeat still marks a live run (effective_status, check_resumable).
    The lock file itself is never deleted (deleting lock files races).
    """

    _held = threading.local()  # per thread: (st_dev, st_ino) of the directory -> [fd, depth]

    def __init__(self, directory: Path, purpose: str):
        """purpose: the attn command taking it (train, train --resume, sweep, plot, report)."""
        self.directory, self.purpose = Path(directory), purpose
        self._key = None

    def __enter__(self) -> RunLock:
        held = self._held.__dict__.setdefault("locks", {})
        dir_fd = _open_real_directory(self.directory)
        try:
            info = os.fstat(dir_fd)
            self._key = (info.st_dev, info.st_ino)
            if self._key in held:
                held[self._key][1] += 1
                return self
            try:
                fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            except OSError as err:
                raise RunError(f"{self.directory}: cannot take its lock: {describe_os_error(err)}") from None
        finally:
            os.close(dir_fd)
        deadline = time.monotonic() + LOCK_GRACE_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLocked(
                    f"{self.directory}: in use by {describe_holder(holder)}; wait for it to finish "
                    "(or stop that process), then try again",
                    holder,
                ) from None
        record = json.dumps({"purpose": self.purpose, "since": time.time(), **writer_identity()}).encode()
        with contextlib.suppress(OSError):  # a full disk: the lock holds, only its record is missing
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        held[self._key] = [fd, 1]
        return self

    def __exit__(self, *exc) -> None:
        held = self._held.__dict__["locks"]
        entry = held[self._key]
        entry[1] -= 1
        if entry[1] == 0:
            del held[self._key]
            with contextlib.suppress(OSError):
                os.ftruncate(entry[0], 0)  # no holder recorded once it is released
            os.close(entry[0])  # releases the flock


class SharedLock:
    """A lock many processes hold together (a shared flock on `path`), as
    running sweeps of one experiment do. Entering yields last_one_out(): it
    ends this process's share and tells whether no other process holds one;
    if none does, this one then holds the lock alone until it leaves (a
    process entering meanwhile waits), so exactly one of them acts last."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self):
        try:
            self._file = open(self.path, "a")
        except OSError as err:
            raise RunError(f"{self.path}: cannot open the lock file: {describe_os_error(err)}") from None
        fcntl.flock(self._file, fcntl.LOCK_SH)
        return self._last_one_out

    def _last_one_out(self) -> bool:
        fcntl.flock(self._file, fcntl.LOCK_UN)
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def __exit__(self, *exc) -> None:
        self._file.close()


def is_locked(directory: Path) -> bool:
    """Whether some process holds the directory's RunLock (a shared flock
    tried and released at once; this process's own lock reads as held)."""
    try:
        fd = os.open(Path(directory) / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # never locked (or not readable: no evidence of a writer)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the shared lock if it was taken


def describe_holder(holder: dict) -> str:
    """'attn sweep (pid 123 on host-a since 12:00:03)' from a lock file's record
    (its purpose is the attn command holding it)."""
    if not holder:
        return "another process (it has not recorded its pid yet)"
    since = holder.get("since")
    when = f" since {time.strftime('%H:%M:%S', time.localtime(since))}" if is_finite_number(since) else ""
    return f"attn {str(holder.get('purpose'))[:40]} (pid {holder.get('pid')} on {str(holder.get('host'))[:80]}{when})"


def _read_holder(fd: int) -> dict:
    """The holder's record in a lock file; {} if it has not written it yet
    (it does so right after taking the lock: read again for a moment)."""
    for _ in range(10):
        with contextlib.suppress(OSError, ValueError):
            holder = json.loads(os.pread(fd, 4096, 0).decode())
            if isinstance(holder, dict):
                return holder
        time.sleep(0.01)
    return {}


def _open_real_directory(directory: Path) -> int:
    """A descriptor of `directory`, refusing a symbolic link, a non-directory or a missing one."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(directory):  # Linux says ENOTDIR for a link with O_DIRECTORY
            raise RunError(
                f"{directory}: is a symbolic link; attn writes only into a real directory "
                "(use the directory it points to, or move that directory here)"
            ) from None
        if err.errno == errno.ENOTDIR:
            raise RunError(f"{directory}: not a directory") from None
        if err.errno == errno.ENOENT:
            raise RunError(f"{directory}: no such directory") from None
        raise RunError(f"{directory}: cannot open: {describe_os_error(err)}") from None


def effective_status(summary: dict | None, now: float | None = None, run_dir: Path | None = None) -> str:
    """The recorded status, or `stale` for a `running` run whose writer is gone.

    Given the run directory, its RunLock held by another process means
    `running`, also before the first summary.json; a directory with a
    config.yaml but neither a summary nor a lock holder was left by a writer
    killed before it wrote one: `stale`. Otherwise (and without the
    directory) a `running` run is stale when, on this host, its pid is dead,
    or elsewhere (a file system may not share locks between hosts) it has
    had no heartbeat for STALE_AFTER_SECONDS. Never call it on a directory
    whose lock this process holds: its own lock reads as another's."""
    if summary is None:
        if run_dir is None or not (Path(run_dir) / "config.yaml").is_file():
            return "unknown"
        return "running" if is_locked(run_dir) else "stale"
    status = summary.get("status", "unknown")
    if status != "running" or (run_dir is not None and is_locked(run_dir)):
        return status
    if summary.get("host") == socket.gethostname():
        return status if _same_process_alive(summary) else "stale"
    now = time.time() if now is None else now
    updated = summary.get("updated_at")
    return "stale" if not is_finite_number(updated) or now - updated > STALE_AFTER_SECONDS else status


def _same_process_alive(summary: dict) -> bool:
    """The run's writer still exists: its pid is alive and, where the identity
    was recorded, it is the same process (not a pid reused after a reboot)."""
    pid = summary.get("pid")
    if not pid_alive(pid):
        return False
    recorded = summary.get("process")
    return recorded is None or recorded == process_identity(pid)
