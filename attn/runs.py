"""Everything that touches a run directory.

    runs/<name>/
        config.yaml      resolved config + provenance (written once, atomically)
        metrics.jsonl    one JSON object per logged step (append-only, flushed)
        summary.json     status, heartbeat, final and best figures (atomic)
        checkpoint.npz   parameters, optimiser state, step, RNG state (atomic, no pickle)
        attention.npz    attention weights of a few eval examples at init and at the end
        *.png            figures (see attn.plots)

Every file except metrics.jsonl is written to a temporary file, fsynced and
renamed over the old one, so a crash at any moment leaves either the old or
the new version, never a torn one. A torn last line of metrics.jsonl (power
loss mid-append) is ignored when reading.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import re
import socket
import time
import zipfile
from pathlib import Path

import numpy as np
import yaml

STATUSES = ("running", "completed", "diverged", "interrupted", "failed")
STALE_AFTER_SECONDS = 120.0  # a `running` run whose heartbeat is older than this is stale


class RunError(RuntimeError):
    """A run directory or checkpoint problem; str() is the one-line message."""


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


def read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as err:
        raise RunError(f"{path}: unreadable: {err}") from None


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


def read_config_dict(run_dir: Path) -> dict:
    """The run's config.yaml as a dict, without its provenance."""
    path = Path(run_dir) / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RunError(f"{run_dir}: not a run directory (no config.yaml)") from None
    except (yaml.YAMLError, OSError) as err:
        raise RunError(f"{path}: unreadable: {err}") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: not a mapping")
    data.pop("provenance", None)
    return data


# ---------------------------------------------------------------------------
# metrics.jsonl
# ---------------------------------------------------------------------------
def append_metrics(run_dir: Path, record: dict) -> None:
    """Append one record as a line, flushed and fsynced."""
    line = json.dumps(_json_safe(record), sort_keys=True) + "\n"
    path = Path(run_dir) / "metrics.jsonl"
    try:
        with open(path, "a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise RunError(f"{path}: cannot append: {_describe_os_error(err)}") from None


def read_metrics(run_dir: Path) -> list[dict]:
    """All complete records; a torn last line is ignored."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # torn by a crash mid-append
            raise RunError(f"{path}: line {i + 1} is not JSON") from None
    return records


def truncate_metrics(run_dir: Path, keep_before_step: int) -> int:
    """Keep only records with step < keep_before_step (atomically). Returns how many were dropped."""
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
    return {"updated_at": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
            "process": process_identity(os.getpid())}


def process_identity(pid: int) -> str | None:
    """'<boot id>:<start time in clock ticks>' of a live process on Linux, else None."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    start_ticks = stat.rsplit(")", 1)[1].split()[19]  # field 22 of /proc/<pid>/stat
    return f"{boot_id}:{start_ticks}"


def read_summary(run_dir: Path) -> dict | None:
    return read_json(Path(run_dir) / "summary.json")


def effective_status(summary: dict | None, now: float | None = None) -> str:
    """The recorded status, or `stale` for a `running` run whose process is gone:
    on this host, its pid is dead; elsewhere, no heartbeat for STALE_AFTER_SECONDS."""
    if summary is None:
        return "unknown"
    status = summary.get("status", "unknown")
    if status != "running":
        return status
    if summary.get("host") == socket.gethostname():
        return status if _same_process_alive(summary) else "stale"
    now = time.time() if now is None else now
    return "stale" if now - summary.get("updated_at", 0) > STALE_AFTER_SECONDS else status


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


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz of plain arrays (no pickle), read into memory."""
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def load_checkpoint(path: Path, param_shapes: dict, optim_template: dict, dtype: str):
    """(params, optim_state, meta) from a checkpoint, refusing anything that does
    not match the expected names, shapes and dtypes, or that needs pickle."""
    path = Path(path)
    try:
        npz = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise RunError(f"{path}: no checkpoint") from None
    except (EOFError, OSError, zipfile.BadZipFile) as err:
        raise RunError(f"{path}: refused: not a complete .npz checkpoint ({err})") from None
    except ValueError:  # neither a zip nor an .npy: numpy would try pickle
        raise RunError(f"{path}: refused: not an .npz checkpoint") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise RunError(f"{path}: refused: a single array, not an .npz checkpoint")
    with npz:
        arrays = {key: _read_array(npz, key, path) for key in npz.files}
    if "meta" not in arrays:
        raise RunError(f"{path}: refused: missing array 'meta'")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError:
        raise RunError(f"{path}: refused: array 'meta' is not JSON") from None
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
