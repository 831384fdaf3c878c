"""Everything that touches a run directory.

    runs/<name>/
        config.yaml      resolved config + provenance (written once, atomically)
        metrics.jsonl    one JSON object per logged step (append-only, flushed)
        summary.json     status, heartbeat, final and best figures (atomic)
        checkpoint.npz   parameters, optimiser state, step, RNG state (atomic, no pickle)
        attention.npz    attention weights of a few eval examples at init and at the end
        *.png            figures (see attn.plots)
        .lock            RunLock's file: empty, or the record of the writer holding it

Every file except metrics.jsonl is written to a temporary file, fsynced and
renamed over the old one, so a crash at any moment leaves either the old or
the new version, never a torn one. A torn last line of metrics.jsonl (power
loss mid-append) is ignored when reading.

One writer at a time: every process that writes a run directory (training,
fresh or resumed; a sweep's cell; figures) holds its RunLock, and an
experiment's report writer holds the experiment directory's. A directory
that is a symbolic link is refused as a place to write (RunLock), and files
are appended without following links, so nothing is ever written outside
the directory named.

Every read is bounded and checked: run files must be regular files (not
links, devices or FIFOs) under a size cap, and each reader checks the type
and shape of what it read, failing with one line (RunError) that names the
file, what is wrong and what to do. A damaged file is found before training
starts, so it never marks a run `failed`.

Fault injection (tests only): with ATTN_TEST_KILL_AFTER_WRITES=N in the
environment, the process SIGKILLs itself right after its N-th durable write
(write_atomic, append_metrics), so a test can stop a run at every write
boundary in turn.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import math
import os
import re
import signal
import socket
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import yaml

from attn.config import ConfigError, all_keys, read_regular_file, read_yaml_file

STATUSES = ("running", "completed", "diverged", "interrupted", "failed")
STALE_AFTER_SECONDS = 120.0  # a `running` run whose heartbeat is older than this is stale
MAX_SUMMARY_BYTES = 1 << 20  # summary.json is a few kB
MAX_METRICS_BYTES = 256 << 20  # ~150,000 records of ~1.7 kB: far more than any run here logs
MAX_ARRAYS_BYTES = 256 << 20  # attention.npz (and any other array file but the checkpoint, whose cap is computed)
CHECKPOINT_SLACK_BYTES = 1 << 20  # a checkpoint's headers, metadata and zip directory beyond its arrays
LOCK_NAME = ".lock"
LOCK_GRACE_SECONDS = 0.2  # a writer retries this long: a status probe holds the lock for microseconds
KILL_AFTER_WRITES = "ATTN_TEST_KILL_AFTER_WRITES"  # tests only: see the module docstring
REPAIR_METRICS = "delete that line (or move the run directory away) and try again"


class RunError(RuntimeError):
    """A run directory or checkpoint problem; str() is the one-line message."""


class RunLocked(RunError):
    """The directory's RunLock is held by another writer, named in `holder`."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def _describe_os_error(err: OSError) -> str:
    if err.errno == errno.ENOSPC:
        return "no space left on device"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if err.errno == errno.EROFS:
        return "read-only file system"
    return err.strerror or str(err)


# ---------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------
def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path via a temporary file + fsync + rename: a crash, a
    signal or a full disk at any moment leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError):
            raise RunError(f"{path}: cannot write: {_describe_os_error(err)} (the file is left as it was)") from None
        raise
    with contextlib.suppress(OSError):  # the new file is in place; some file systems cannot fsync a directory
        _fsync_dir(path.parent)
    _count_durable_write()


_writes_done = 0


def _count_durable_write() -> None:
    """The test hook: SIGKILL this process after its ATTN_TEST_KILL_AFTER_WRITES-th durable write."""
    global _writes_done
    limit = os.environ.get(KILL_AFTER_WRITES)
    if limit is None:
        return
    _writes_done += 1
    if _writes_done >= int(limit):
        os.kill(os.getpid(), signal.SIGKILL)


TEMPORARY_NAME = re.compile(r"^\..+\.(\d+)\.tmp$")  # write_atomic's .<name>.<pid>.tmp


def remove_dead_temporaries(run_dir: Path) -> list[str]:
    """Delete write_atomic's temporary files whose writer is gone (a SIGKILL or
    power loss mid-write leaves one); the target files themselves are intact.
    Returns the names removed."""
    removed = []
    for path in Path(run_dir).iterdir():
        match = TEMPORARY_NAME.match(path.name)
        if match and not _pid_alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    return removed


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json_safe(obj):
    """Replace non-finite floats by None so the JSON is standard."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_json(path: Path, obj) -> None:
    write_atomic(path, (json.dumps(_json_safe(obj), indent=2, sort_keys=True) + "\n").encode())


def read_run_file(path: Path, limit: int, what: str) -> bytes | None:
    """A run file's bytes (None if it does not exist): a regular file, not a
    symbolic link, of at most `limit` bytes; else RunError."""
    try:
        return read_regular_file(path, limit, what, error=RunError, follow_symlinks=False)
    except FileNotFoundError:
        return None


# ---------------------------------------------------------------------------
# One writer per directory
# ---------------------------------------------------------------------------
class RunLock:
    """The exclusive write lock of a run directory (or of an experiment
    directory, for its report): an flock on <directory>/.lock.

        with runs.RunLock(run_dir, "train --resume"):
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
                raise RunError(f"{self.directory}: cannot take its lock: {_describe_os_error(err)}") from None
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
                raise RunLocked(f"{self.directory}: in use by {describe_holder(holder)}; wait for it to finish "
                                "(or stop that process), then try again", holder) from None
        record = json.dumps({"purpose": self.purpose, "since": time.time(), **_identity()}).encode()
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
            raise RunError(f"{directory}: is a symbolic link; attn writes only into a real directory "
                           "(use the directory it points to, or move that directory here)") from None
        if err.errno == errno.ENOTDIR:
            raise RunError(f"{directory}: not a directory") from None
        if err.errno == errno.ENOENT:
            raise RunError(f"{directory}: no such directory") from None
        raise RunError(f"{directory}: cannot open: {_describe_os_error(err)}") from None


# ---------------------------------------------------------------------------
# Creating run directories
# ---------------------------------------------------------------------------
def create_run_dir(runs_dir: Path, name: str) -> Path:
    """Create runs_dir/name, or name-2, name-3, ... if taken. Never reuses one.

    os.mkdir is atomic: two runs started at the same moment get two directories.
    """
    runs_dir = Path(runs_dir)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 10_000):
            candidate = runs_dir / (name if attempt == 1 else f"{name}-{attempt}")
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                continue
    except OSError as err:
        raise RunError(f"{runs_dir}: cannot create a run directory: {_describe_os_error(err)}") from None
    raise RunError(f"{runs_dir}: too many runs named {name!r}")


def default_run_name(config_path: str | None) -> str:
    stem = Path(config_path).stem if config_path else "defaults"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def write_config(run_dir: Path, config_dict: dict, provenance: dict) -> None:
    """config.yaml: the resolved config, with a `provenance` section."""
    text = "# attn run config: resolved values; `provenance` is ignored when loaded as a config.\n"
    text += yaml.safe_dump({**config_dict, "provenance": provenance}, sort_keys=False)
    write_atomic(run_dir / "config.yaml", text.encode())


def read_run_config(run_dir: Path, complete: bool = False) -> dict:
    """The run's config.yaml as written: the resolved config and its
    `provenance` (a mapping), read as any config file is (config.read_yaml_file:
    bounded, safe); RunError if it is missing or damaged. With `complete`, also
    if it lacks a field or its provenance: write_config writes every field, so
    a run to be resumed must not take a default for one (a truncated file)."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise RunError(f"{run_dir}: not a run directory (no config.yaml)")
    repair = "move the run directory away"
    try:
        config = read_yaml_file(path)
    except ConfigError as err:
        raise RunError(f"{path}: unreadable: {str(err).removeprefix(f'{path}: ')}; {repair}") from None
    if not isinstance(config.get("provenance", {}), dict):
        raise RunError(f"{path}: unreadable: `provenance` is not a mapping; {repair}")
    missing = next((key for key in [*all_keys(), "provenance"] if not _has_dotted(config, key)), None)
    if complete and missing:
        raise RunError(f"{path}: lacks `{missing}`, which attn writes into every run's config.yaml "
                       f"(is it cut short, or from an older attn?); {repair}")
    return config


def _has_dotted(data: dict, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def read_config_dict(run_dir: Path) -> dict:
    """The run's config.yaml as a dict, without its provenance."""
    data = read_run_config(run_dir)
    data.pop("provenance", None)
    return data


# ---------------------------------------------------------------------------
# metrics.jsonl
# ---------------------------------------------------------------------------
def append_metrics(run_dir: Path, record: dict) -> None:
    """Append one record as a line, flushed and fsynced (never through a symbolic
    link, never waiting on a FIFO)."""
    line = json.dumps(_json_safe(record), sort_keys=True) + "\n"
    path = Path(run_dir) / "metrics.jsonl"
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path, flags, 0o644)
        with open(fd, "a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise RunError(f"{path}: cannot append: {_describe_os_error(err)}") from None
    _count_durable_write()


def read_metrics(run_dir: Path) -> list[dict]:
    """All complete records, checked: each line a JSON object of scalars with
    an integer `step`, steps increasing (a file two writers appended to is
    refused); a torn last line is ignored. RunError names the first bad line."""
    path = Path(run_dir) / "metrics.jsonl"
    data = read_run_file(path, MAX_METRICS_BYTES, "metrics file")
    if data is None:
        return []
    lines = data.split(b"\n")
    records, last_step = [], -1
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if number == len(lines) or (number == len(lines) - 1 and not lines[-1]):
                break  # the last line, torn by a crash mid-append
            what = "UTF-8 text" if isinstance(err, UnicodeDecodeError) else "JSON"
            raise RunError(f"{path}: line {number} is not {what}; {REPAIR_METRICS}") from None
        problem = _record_problem(record, last_step)
        if problem:
            raise RunError(f"{path}: line {number} {problem}; {REPAIR_METRICS}")
        records.append(record)
        last_step = record["step"]
    return records


def _record_problem(record, last_step: int) -> str | None:
    """What is wrong with a metrics record read back, or None."""
    if not isinstance(record, dict):
        return f"is not a JSON object (got {_json_kind(record)})"
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return "has no integer `step` >= 0"
    if step <= last_step:
        return f"has step {step} after step {last_step} (steps must increase; two writers?)"
    nested = next((key for key, value in record.items() if isinstance(value, (dict, list))), None)
    if nested is not None:
        return f"holds {_json_kind(record[nested])} in `{nested[:80]}`; expected numbers"
    return None


def _json_kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def truncate_metrics(run_dir: Path, keep_before_step: int) -> int:
    """Keep only records with step < keep_before_step (atomically). Returns how many were dropped.
    Only the directory's RunLock holder may call it."""
    records = read_metrics(run_dir)
    kept = [r for r in records if r["step"] < keep_before_step]
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept)
    write_atomic(Path(run_dir) / "metrics.jsonl", text.encode())
    return len(records) - len(kept)


# ---------------------------------------------------------------------------
# summary.json and status
# ---------------------------------------------------------------------------
def heartbeat_fields() -> dict:
    """Who is writing this run: time, host, pid, and the pid's identity
    (boot id + start time) so a reused pid after a reboot is not mistaken
    for the run's process."""
    return {"updated_at": time.time(), **_identity()}


def _identity() -> dict:
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


def _is_text(value) -> bool:
    return isinstance(value, str)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value) -> bool:  # null stands for a non-finite or meaningless number
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _is_figures(value) -> bool:
    return isinstance(value, dict) and all(_is_number(v) for v in value.values())


SUMMARY_FIELDS = {  # the fields readers use: key -> (check, what it must be); others are kept as they are
    "status": (lambda v: v in STATUSES, "one of " + ", ".join(STATUSES)),
    "reason": (lambda v: v is None or _is_text(v), "a string or null"),
    "host": (_is_text, "a string"),
    "process": (lambda v: v is None or _is_text(v), "a string or null"),
    "plot_error": (_is_text, "a string"),
    "task": (_is_text, "a string"),
    "pid": (_is_count, "an integer >= 0"),
    "step": (_is_count, "an integer >= 0"),
    "steps": (_is_count, "an integer >= 0"),
    "nonfinite_steps": (_is_count, "an integer >= 0"),
    "resumed_from": (lambda v: v is None or _is_count(v), "an integer >= 0 or null"),
    "updated_at": (_is_number, "a number"),
    "started_at": (_is_number, "a number"),
    "wall_time": (_is_number, "a number"),
    "steps_per_sec": (_is_number, "a number"),
    "final": (_is_figures, "a mapping of numbers"),
    "best": (_is_figures, "a mapping of numbers"),
    "references": (_is_figures, "a mapping of numbers"),
}


def read_summary(run_dir: Path) -> dict | None:
    """summary.json (None before the first is written), checked: a JSON object
    whose SUMMARY_FIELDS have the right types; else RunError naming the field."""
    path = Path(run_dir) / "summary.json"
    data = read_run_file(path, MAX_SUMMARY_BYTES, "run summary")
    if data is None:
        return None
    repair = "delete it (a resumed run writes it again) or move the run directory away"
    try:
        summary = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RunError(f"{path}: unreadable: not JSON; {repair}") from None
    if not isinstance(summary, dict):
        raise RunError(f"{path}: unreadable: not a JSON object (got {_json_kind(summary)}); {repair}")
    for key, (check, expected) in SUMMARY_FIELDS.items():
        if key in summary and not check(summary[key]):
            raise RunError(f"{path}: unreadable: `{key}` is {_json_kind(summary[key])}, expected {expected}; {repair}")
    return summary


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


def is_finite_number(value) -> bool:
    """A metric value that can be drawn or averaged: an int or float (not a
    bool), finite. Records store non-finite and meaningless values as null."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_number(value, spec: str) -> str:
    """A metric for people: formatted if it is a finite number, else 'nan'
    (records store non-finite values, and meaningless ones, as null)."""
    return format(value, spec) if is_finite_number(value) else "nan"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a '|' inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def summary_figures(summary: dict) -> str:
    """'eval_loss 0.0012  eval_acc 1.000  steps_to_99 50' from a summary, in memory
    (NaN) or read back from disk (null)."""
    final, best = summary.get("final") or {}, summary.get("best") or {}
    return (f"eval_loss {format_number(final.get('eval_loss'), '.4g')}  "
            f"eval_acc {format_number(final.get('eval_accuracy'), '.3f')}  "
            f"steps_to_99 {best.get('steps_to_99') if best.get('steps_to_99') is not None else 'never'}")


def _same_process_alive(summary: dict) -> bool:
    """The run's writer still exists: its pid is alive and, where the identity
    was recorded, it is the same process (not a pid reused after a reboot)."""
    pid = summary.get("pid")
    if not _pid_alive(pid):
        return False
    recorded = summary.get("process")
    return recorded is None or recorded == process_identity(pid)


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------
# Checkpoints: npz, no pickle
# ---------------------------------------------------------------------------
def save_checkpoint(path: Path, params: dict, optim_state: dict, meta: dict) -> None:
    """params under 'param/<name>', optimiser state under 'optim/<key>', meta as JSON text."""
    arrays = {f"param/{k}": v for k, v in params.items()}
    arrays.update({f"optim/{k}": v for k, v in optim_state.items()})
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    save_arrays(path, arrays)


def save_arrays(path: Path, arrays: dict) -> None:
    """An .npz of plain arrays, written atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomic(Path(path), buffer.getvalue())


def load_arrays(path: Path, limit: int = MAX_ARRAYS_BYTES, what: str = "array file") -> dict[str, np.ndarray]:
    """Every array of an .npz of plain arrays (no pickle), read into memory:
    RunError for a missing file, one that is not a complete .npz, holds an
    object array or is larger than `limit` bytes on disk or unpacked."""
    path = Path(path)
    data = read_run_file(path, limit, what)
    if data is None:
        raise RunError(f"{path}: no {what}")
    try:
        npz = np.load(io.BytesIO(data), allow_pickle=False)
    except (EOFError, OSError, zipfile.BadZipFile) as err:
        raise RunError(f"{path}: refused: not a complete .npz {what} ({err})") from None
    except ValueError:  # neither a zip nor an .npy: numpy would try pickle
        raise RunError(f"{path}: refused: not an .npz {what}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise RunError(f"{path}: refused: a single array, not an .npz {what}")
    with npz:
        unpacked = sum(info.file_size for info in npz.zip.infolist())
        if unpacked > limit:
            raise RunError(f"{path}: refused: its arrays unpack to {unpacked} bytes (limit {limit})")
        return {key: _read_array(npz, key, path) for key in npz.files}


def checkpoint_limit(param_shapes: dict, optim_template: dict, dtype: str) -> int:
    """The largest checkpoint.npz a run of these sizes can write: its arrays plus slack."""
    params = sum(math.prod(shape) for shape in param_shapes.values()) * np.dtype(dtype).itemsize
    return params + sum(v.nbytes for v in optim_template.values()) + CHECKPOINT_SLACK_BYTES


def load_checkpoint(path: Path, param_shapes: dict, optim_template: dict, dtype: str):
    """(params, optim_state, meta) from a checkpoint, refusing anything that does
    not match the expected names, shapes and dtypes, needs pickle, or is larger
    than a checkpoint of these sizes can be (checkpoint_limit)."""
    path = Path(path)
    arrays = load_arrays(path, checkpoint_limit(param_shapes, optim_template, dtype), "checkpoint")
    if "meta" not in arrays:
        raise RunError(f"{path}: refused: missing array 'meta'")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError:
        raise RunError(f"{path}: refused: array 'meta' is not JSON") from None
    if not isinstance(meta, dict):
        raise RunError(f"{path}: refused: array 'meta' is not a JSON object")
    params = _take(arrays, "param/", {k: (s, dtype) for k, s in param_shapes.items()}, path)
    optim_state = _take(arrays, "optim/", {k: (v.shape, v.dtype) for k, v in optim_template.items()}, path)
    return params, optim_state, meta


def _read_array(npz, key: str, path: Path) -> np.ndarray:
    try:
        return npz[key]
    except ValueError:  # an object array: only pickle could load it
        raise RunError(f"{path}: refused: array {key!r} holds objects that need pickle to load") from None
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise RunError(f"{path}: refused: array {key!r} is damaged ({err})") from None


def _take(arrays: dict, prefix: str, expected: dict, path: Path) -> dict:
    out = {}
    for name, (shape, dtype) in expected.items():
        key = prefix + name
        if key not in arrays:
            raise RunError(f"{path}: refused: missing array {key!r}")
        value = arrays[key]
        if value.shape != tuple(shape) or value.dtype != np.dtype(dtype):
            raise RunError(f"{path}: refused: {key!r} is {value.dtype}{list(value.shape)}, "
                           f"expected {np.dtype(dtype)}{list(shape)}")
        out[name] = value
    return out
