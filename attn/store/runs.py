"""Everything that touches a run directory (its .npz array files through attn.store.arrayfiles).

    runs/<name>/
        config.yaml      resolved config + provenance (written once, atomically)
        metrics.jsonl    one JSON object per logged step (append-only, flushed; fsynced before a checkpoint)
        summary.json     status, heartbeat, final and best figures (atomic)
        checkpoint.npz   parameters, optimiser state, step, RNG state (atomic, no pickle):
                         the last one, a second name (hard link) of checkpoint-<step>.npz
        checkpoint-<step>.npz   the last logging.keep_checkpoints checkpoints and every logging.keep_every-th,
                         kept by their step (to fork from; attn.store.runstate.retained_steps)
        mechanism.npz    per-row saturation and gradient norms at step 0 and logging.mechanism_step
        attention.npz    attention weights of a few eval examples at init and at the end
        *.png            figures (see attn.train.figures)

    runs/<experiment>/   an experiment's report (attn.report.experiment_report):
        report.json      every cell's statistics, verdicts and tables, without the per-seed records
        seeds.json.gz    the per-seed records of report.json's cells (most of the report's bytes:
                         kept apart and compressed so the published report stays small);
                         write_report_json / read_report_json split and join them
        .lock            RunLock's file: empty, or the record of the writer holding it

Every file except metrics.jsonl is written to a temporary file, fsynced and
renamed over the old one, so a crash at any moment leaves either the old or
the new version, never a torn one. metrics.jsonl is appended and flushed per
record, and fsynced before each checkpoint and the final summary, so every
record a checkpoint follows is on disk; a torn last line (power loss
mid-append) is ignored when reading.

One writer at a time: every process that writes a run directory (training,
fresh or resumed; a sweep's cell; figures) holds its RunLock (attn.store.locks),
and an experiment's report writer holds the experiment directory's. A
directory that is a symbolic link is refused as a place to write, and files
are appended without following links, so nothing is ever written outside
the directory named.

Every read is bounded and checked: run files must be regular files (not
links, devices or FIFOs) under a size cap, and each reader checks the type
and shape of what it read, failing with one line (RunError) that names the
file, what is wrong and what to do. A damaged file is found before training
starts, so it never marks a run `failed`.

Fault injection (tests only): with ATTN_TEST_KILL_AFTER_WRITES=N in the
environment, the process SIGKILLs itself right after its N-th durable write
(write_atomic, append_metrics, durable_write_done), so a test can stop a run or a publish at every write
boundary in turn.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import math
import os
import re
import signal
import threading
import time
import typing
import zlib
from pathlib import Path

import numpy as np

from attn import outcomes
from attn.config.schema import all_keys
from attn.config.yamlio import (
    ConfigError,
    dump_yaml,
    open_regular_file,
    read_regular_file,
    read_yaml_file,
    show_value,
)
from attn.store.processes import pid_alive, writer_identity

STATUSES = ("running", "completed", "diverged", "interrupted", "failed")
FINISHED = outcomes.ENDED  # the statuses whose last figures are final: a run with one is never resumed
MAX_SUMMARY_BYTES = 1 << 20  # summary.json is a few kB
MAX_METRICS_BYTES = 256 << 20  # ~150,000 records of ~1.7 kB: far more than any run here logs
MAX_METRICS_LINE_BYTES = 1 << 20  # one record: ~1.7 kB
KILL_AFTER_WRITES = "ATTN_TEST_KILL_AFTER_WRITES"  # tests only: see the module docstring
REPAIR_METRICS = "delete that line (or move the run directory away) and try again"


class RunError(RuntimeError):
    """A run directory or checkpoint problem; str() is the one-line message."""


def describe_os_error(err: OSError) -> str:
    if err.errno == errno.ENOSPC:
        return "no space left on device"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if err.errno == errno.EROFS:
        return "read-only file system"
    if err.errno == errno.ENAMETOOLONG:
        return "the path is too long"
    if err.errno == errno.ENOTDIR:
        return "a component of the path is not a directory"
    return err.strerror or str(err)


PATH_FIXES = {  # errno -> what to do about a path a user gave that the OS refused
    errno.ENAMETOOLONG: "choose a shorter path (each name at most 255 bytes, the whole path at most 4096)",
    errno.ENOTDIR: "a name in it is a file: choose a path whose every parent is a directory",
    errno.EACCES: "choose a place you may write, or change its permissions",
    errno.EPERM: "choose a place you may write, or change its permissions",
    errno.EROFS: "choose a place on a writable file system",
    errno.ENOSPC: "free some space (or choose another disk) and run the same command again",
    errno.ELOOP: "it goes through too many symbolic links: choose a plain directory path",
}


def describe_path_error(path, err: OSError) -> str:
    """One line for an OS error from a path a user gave: the path (cut), what went wrong, the fix."""
    fix = PATH_FIXES.get(err.errno, "check the path and try again")
    return f"{show_value(str(path))}: {describe_os_error(err)}; {fix}"


# ---------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------
def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path via a temporary file + fsync + rename: a crash, a
    signal or a full disk at any moment leaves the old file or the new one."""
    path = Path(path)
    tmp = _temporary_of(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as err:
        _discard(tmp, path, err)
    _put_in_place(tmp, path)


def copy_atomic(source: typing.BinaryIO, path: Path, size: int) -> None:
    """Write the next `size` bytes of the open file `source` (fewer if it ends first) to path as write_atomic
    writes, a piece at a time: a file of any size costs a piece of memory."""
    path = Path(path)
    tmp = _temporary_of(path)
    try:
        with open(tmp, "wb") as fh:
            left = size
            while left > 0 and (piece := source.read(min(left, 1 << 20))):
                fh.write(piece)
                left -= len(piece)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as err:
        _discard(tmp, path, err)
    _put_in_place(tmp, path)


def link_atomic(source: Path, path: Path) -> None:
    """Make path a second name of source (a hard link: no bytes copied), atomically
    like write_atomic: a crash leaves the old path or the new one. Where the
    file system has no hard links, path gets a copy of source's bytes."""
    source, path = Path(source), Path(path)
    tmp = _temporary_of(path)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(source, tmp)
    except OSError:
        write_atomic(path, source.read_bytes())
        return
    _put_in_place(tmp, path)


def _temporary_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")  # TEMPORARY_NAME matches it


def _put_in_place(tmp: Path, path: Path) -> None:
    """Rename the finished temporary over path, then make the rename durable."""
    try:
        os.replace(tmp, path)
    except BaseException as err:
        _discard(tmp, path, err)
    with contextlib.suppress(OSError):  # the new file is in place; some file systems cannot fsync a directory
        _fsync_dir(path.parent)
    _count_durable_write()


def _discard(tmp: Path, path: Path, err: BaseException) -> typing.NoReturn:
    """The temporary removed, path left as it was; an OSError as one line (RunError)."""
    with contextlib.suppress(OSError):
        tmp.unlink()
    if isinstance(err, OSError):
        raise RunError(f"{path}: cannot write: {describe_os_error(err)} (the file is left as it was)") from None
    raise err


_writes_done = 0
_writes_counted = threading.Lock()  # writes may come from several threads at once


def durable_write_done() -> None:
    """Count a durable write made elsewhere (a directory swapped in by a rename) for the test hook below."""
    _count_durable_write()


def _count_durable_write() -> None:
    """The test hook: SIGKILL this process after its ATTN_TEST_KILL_AFTER_WRITES-th durable write."""
    global _writes_done
    limit = os.environ.get(KILL_AFTER_WRITES)
    if limit is None:
        return
    with _writes_counted:
        _writes_done += 1
        reached = _writes_done >= int(limit)
    if reached:
        os.kill(os.getpid(), signal.SIGKILL)


TEMPORARY_NAME = re.compile(r"^\..+\.(\d+)\.tmp$")  # write_atomic's .<name>.<pid>.tmp


def remove_dead_temporaries(run_dir: Path) -> list[str]:
    """Delete write_atomic's temporary files whose writer is gone (a SIGKILL or
    power loss mid-write leaves one); the target files themselves are intact.
    Returns the names removed."""
    removed = []
    for path in Path(run_dir).iterdir():
        match = TEMPORARY_NAME.match(path.name)
        if match and not pid_alive(int(match.group(1))):
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


def write_json(path: Path, obj, indent: int | None = 2) -> None:
    """obj as JSON (keys sorted; indent None: compact, for large machine-read files), atomically."""
    separators = None if indent else (",", ":")
    write_atomic(
        path, (json.dumps(_json_safe(obj), indent=indent, sort_keys=True, separators=separators) + "\n").encode()
    )


REPORT_FILE = "report.json"
SEEDS_FILE = "seeds.json.gz"
SEEDED_LISTS = ("cells", "selection")  # report.json's lists whose entries carry per-seed records ("seeds")


def write_report_json(directory: Path, report: dict) -> None:
    """An experiment's report as report.json, its entries' per-seed records
    apart in seeds.json.gz (gzip without a timestamp: the same report, the
    same bytes); report.json names the seeds file's digest, so a reader
    never joins records of another report. The seeds file is written first."""
    directory = Path(directory)
    records = {key: [entry.get("seeds", []) for entry in report.get(key, [])] for key in SEEDED_LISTS}
    seeds = gzip.compress(
        (json.dumps(_json_safe(records), sort_keys=True, separators=(",", ":")) + "\n").encode(), mtime=0
    )
    write_atomic(directory / SEEDS_FILE, seeds)
    slim = {
        **report,
        **{
            key: [{k: v for k, v in entry.items() if k != "seeds"} for entry in report.get(key, [])]
            for key in SEEDED_LISTS
            if key in report
        },
        "seeds_file": {"name": SEEDS_FILE, "sha256": hashlib.sha256(seeds).hexdigest()},
    }
    write_json(directory / REPORT_FILE, slim, indent=None)


MAX_REPORT_BYTES = 64 << 20  # report.json: a few hundred kB, its per-seed records kept apart
MAX_SEEDS_BYTES = 64 << 20  # seeds.json.gz inflated: ~1.5 kB a run, 40,000 runs (the largest experiment here: 5 MB)


def read_report_json(directory: Path) -> dict:
    """report.json joined with its per-seed records (write_report_json); RunError, one line, when
    report.json is missing, over MAX_REPORT_BYTES, not a JSON object, or names its seeds file other than
    by a plain file name beside it; when that file is missing, of another report (its digest), not one
    gzip stream, or inflates past MAX_SEEDS_BYTES (its output is bounded as it is inflated); or when its
    records do not fit the report's lists. No byte of a refused file is shown."""
    directory = Path(directory)
    path = directory / REPORT_FILE
    rewrite = "write the report again (attn report)"
    data = read_run_file(path, MAX_REPORT_BYTES, "report")
    if data is None:
        raise RunError(f"{path}: no report; {rewrite}")
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        what = "UTF-8 text" if isinstance(err, UnicodeDecodeError) else "JSON (cut short?)"
        raise RunError(f"{path}: unreadable: not {what}; {rewrite}") from None
    if not isinstance(report, dict):
        raise RunError(f"{path}: unreadable: not a JSON object (got {_json_kind(report)}); {rewrite}")
    for key in SEEDED_LISTS:
        entries = report.get(key, [])
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise RunError(
                f"{path}: unreadable: `{key}` is {_json_kind(entries)}, expected a list of objects; {rewrite}"
            )
    named = report.pop("seeds_file", None)
    if named is None:
        return report  # written before the records were kept apart: they are inline
    name, digest = (named.get("name"), named.get("sha256")) if isinstance(named, dict) else (None, None)
    if not (is_plain_file_name(name) and isinstance(digest, str)):
        raise RunError(
            f"{path}: unreadable: `seeds_file` is {show_value(named)}; expected "
            f"{{name: <a file name beside it, e.g. {SEEDS_FILE}>, sha256: <its digest>}}; {rewrite}"
        )
    seeds_path = directory / name
    seeds = read_run_file(seeds_path, MAX_REPORT_BYTES, "seeds file")
    if seeds is None:
        raise RunError(f"{seeds_path}: missing, but {path} keeps its per-seed records there; {rewrite}")
    if hashlib.sha256(seeds).hexdigest() != digest:
        raise RunError(f"{seeds_path}: not the per-seed records of {path} (its digest differs); {rewrite}")
    records = _inflated_json(seeds, seeds_path, MAX_SEEDS_BYTES, rewrite)
    if not isinstance(records, dict) or not all(
        key in SEEDED_LISTS and isinstance(lists, list) and len(lists) == len(report.get(key, []))
        for key, lists in records.items()
    ):
        raise RunError(f"{seeds_path}: unreadable: its records do not fit the lists of {path}; {rewrite}")
    for key, lists in records.items():
        for entry, entry_records in zip(report.get(key, []), lists):
            entry["seeds"] = entry_records
    return report


def is_plain_file_name(name) -> bool:
    """Whether `name` names a file directly inside a directory: one path component, not `.` or `..`, no
    separator or NUL, printable."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and name.isprintable()
    )


def _inflated_json(data: bytes, path: Path, limit: int, repair: str):
    """The JSON inside one gzip stream, inflated to at most `limit` bytes (a small file can inflate to
    gigabytes: it is refused once its output passes the limit, not after); RunError otherwise."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip's header and trailer
    try:
        text = inflater.decompress(data, limit + 1)
    except zlib.error:
        raise RunError(f"{path}: unreadable: not a gzip stream, or a damaged one; {repair}") from None
    if len(text) > limit:
        raise RunError(f"{path}: refused: inflates to more than {limit} bytes; {repair}")
    if not inflater.eof or inflater.unused_data:
        raise RunError(f"{path}: unreadable: not one whole gzip stream (cut short, or more after it); {repair}")
    try:
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RunError(f"{path}: unreadable: its records are not JSON; {repair}") from None


def read_run_file(path: Path, limit: int, what: str) -> bytes | None:
    """A run file's bytes (None if it does not exist): a regular file, not a
    symbolic link, of at most `limit` bytes; else RunError."""
    try:
        return read_regular_file(path, limit, what, error=RunError, follow_symlinks=False)
    except FileNotFoundError:
        return None


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
        raise RunError(f"cannot create a run directory in {describe_path_error(runs_dir, err)}") from None
    raise RunError(f"{runs_dir}: too many runs named {name!r}")


def disk_use(run_dir: Path) -> int:
    """Bytes a run directory takes on disk: its files' allocated blocks, a file
    with two names (checkpoint.npz and the checkpoint-<step>.npz it links) once."""
    seen, total = set(), 0
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return 0
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            total += getattr(info, "st_blocks", 0) * 512 or info.st_size
    return total


def format_bytes(n: int) -> str:
    """Like du -h: 512B, 40K, 6.4M, 1.2G."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{n}B"


def default_run_name(config_path: str | None) -> str:
    stem = Path(config_path).stem if config_path else "defaults"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def write_config(run_dir: Path, config_dict: dict, provenance: dict) -> None:
    """config.yaml: the resolved config, with a `provenance` section."""
    text = "# attn run config: resolved values; `provenance` is ignored when loaded as a config.\n"
    text += dump_yaml({**config_dict, "provenance": provenance}, sort_keys=False)
    write_atomic(run_dir / "config.yaml", text.encode())


NOT_A_RUN = "not a run directory (no config.yaml)"


def not_a_run(run_dir: Path) -> str:
    """Why `run_dir` is no run (it has no config.yaml), for an error line: a
    directory holding a run's files without it is a run whose making was cut
    short (attn.train.lifecycle.new_run writes config.yaml last)."""
    held = (
        sorted(
            p.name for p in Path(run_dir).iterdir() if p.name in ("metrics.jsonl", "summary.json") or p.suffix == ".npz"
        )
        if Path(run_dir).is_dir()
        else []
    )
    if not held:
        return NOT_A_RUN
    return (
        f"not a run directory: no config.yaml, though it holds {', '.join(held[:3])}: its making was cut short "
        "before config.yaml was written (a fork or run killed as it was made); nothing in it can be used, "
        "remove it"
    )


def read_run_config(run_dir: Path, complete: bool = False) -> dict:
    """The run's config.yaml as written: the resolved config and its
    `provenance` (a mapping), read as any config file is (yamlio.read_yaml_file:
    bounded, safe); RunError if it is missing or damaged. With `complete`, also
    if it lacks a field or its provenance: write_config writes every field, so
    a run to be resumed must not take a default for one (a truncated file)."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise RunError(f"{run_dir}: {not_a_run(run_dir)}")
    repair = "move the run directory away"
    try:
        config = read_yaml_file(path)
    except ConfigError as err:
        raise RunError(f"{path}: unreadable: {str(err).removeprefix(f'{path}: ')}; {repair}") from None
    if not isinstance(config.get("provenance", {}), dict):
        raise RunError(f"{path}: unreadable: `provenance` is not a mapping; {repair}")
    missing = next((key for key in [*all_keys(), "provenance"] if not _has_dotted(config, key)), None)
    if complete and missing:
        raise RunError(
            f"{path}: lacks `{missing}`, which attn writes into every run's config.yaml "
            f"(is it cut short, or from an older attn?); {repair}"
        )
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
    """Append one record as a line, flushed (never through a symbolic link,
    never waiting on a FIFO). A killed process loses no flushed line; the
    file reaches the disk at sync_metrics, before each checkpoint and the
    final summary, which is all a resume needs (it drops the records past
    the checkpoint): one fsync per checkpoint, not one per record."""
    line = json.dumps(_json_safe(record), sort_keys=True) + "\n"
    path = Path(run_dir) / "metrics.jsonl"
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path, flags, 0o644)
        with open(fd, "a") as fh:
            fh.write(line)
    except OSError as err:
        raise RunError(f"{path}: cannot append: {describe_os_error(err)}") from None
    _count_durable_write()


def sync_metrics(run_dir: Path) -> None:
    """metrics.jsonl's appended records made durable (fsync), if it exists."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as err:
        raise RunError(f"{path}: cannot sync: {describe_os_error(err)}") from None
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_metrics(run_dir: Path) -> list[dict]:
    """All complete records, checked: each line a JSON object of scalars with
    an integer `step`, steps increasing (a file two writers appended to is
    refused); a torn last line is ignored. RunError names the first bad line."""
    return list(iter_metrics(run_dir))


def last_metrics_record(run_dir: Path) -> dict | None:
    """The last complete record (None if there is none), every line checked on the way as read_metrics
    checks it, none kept: memory for a line, whatever the file's size (`attn runs`)."""
    last = None
    for last in iter_metrics(run_dir):
        pass
    return last


def iter_metrics(run_dir: Path) -> typing.Iterator[dict]:
    """metrics.jsonl's records one at a time, checked as read_metrics says, read a line at a time (a line
    longer than MAX_METRICS_LINE_BYTES is refused: no record is that long), the file's size capped
    (MAX_METRICS_BYTES) before it is read and while it is."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        handle = open_regular_file(path, MAX_METRICS_BYTES, "metrics file", error=RunError, follow_symlinks=False)
    except FileNotFoundError:
        return
    with handle:
        last_step, number, read = -1, 1, 0
        line = _metrics_line(handle, path, number)
        while line:
            read += len(line)
            if read > MAX_METRICS_BYTES:
                raise RunError(
                    f"{path}: more than {MAX_METRICS_BYTES} bytes is too large for a metrics file "
                    "(it grew while being read)"
                )
            following = _metrics_line(handle, path, number + 1)
            if line.strip():
                try:
                    record = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as err:
                    if not following:
                        return  # the last line, torn by a crash mid-append
                    what = "UTF-8 text" if isinstance(err, UnicodeDecodeError) else "JSON"
                    raise RunError(f"{path}: line {number} is not {what}; {REPAIR_METRICS}") from None
                problem = _record_problem(record, last_step)
                if problem:
                    raise RunError(f"{path}: line {number} {problem}; {REPAIR_METRICS}")
                last_step = record["step"]
                yield record
            line, number = following, number + 1


def _metrics_line(handle, path: Path, number: int) -> bytes:
    """The next line of metrics.jsonl (b"" at its end); RunError for one longer than MAX_METRICS_LINE_BYTES."""
    try:
        line = handle.readline(MAX_METRICS_LINE_BYTES + 1)
    except OSError as err:
        raise RunError(f"{path}: cannot read metrics file: {describe_os_error(err)}") from None
    if len(line) > MAX_METRICS_LINE_BYTES:
        raise RunError(
            f"{path}: line {number} is longer than {MAX_METRICS_LINE_BYTES} bytes, which no record is; {REPAIR_METRICS}"
        )
    return line


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
        type(value), "a number"
    )


JSON_TYPES = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    dict: "an object",
    list: "a list",
    object: "any value",
}


class Check(typing.NamedTuple):
    """A leaf of a JSON shape (json_shape_problem): the values `accepts` takes, which `what` names."""

    accepts: typing.Callable[[object], bool]
    what: str


class MayLack(typing.NamedTuple):
    """A key of an object's shape (json_shape_problem) that the object may lack; where it holds one, of `shape`."""

    shape: object


class EachValue(typing.NamedTuple):
    """An object whose every value, whatever its key, is of `shape` (json_shape_problem)."""

    shape: object


def json_shape_problem(value, shape, where: str = "") -> str | None:
    """What in JSON read back does not have `shape`, or None: a shape is a type (str, int, bool, dict, list
    or object, any value), a Check, [shape] a list of that shape, EachValue(shape) an object of values of
    that shape, or {key: shape} an object holding at least those keys (but the MayLack ones), each of its
    shape. '`cells[2].n` is a string, expected an integer'."""
    at = f"`{where}`" if where else "the file"
    if isinstance(shape, Check):
        return None if shape.accepts(value) else f"{at} is {_json_kind(value)}, expected {shape.what}"
    if isinstance(shape, (dict, EachValue)) and not isinstance(value, dict):
        return f"{at} is {_json_kind(value)}, expected an object"
    if isinstance(shape, EachValue):
        return next(
            (p for key, item in value.items() if (p := json_shape_problem(item, shape.shape, f"{where}[{key!r:.40}]"))),
            None,
        )
    if isinstance(shape, dict):
        for key, inner in shape.items():
            inside = f"{where}.{key}" if where else key
            if key not in value:
                if isinstance(inner, MayLack):
                    continue
                return f"`{inside}` is missing"
            problem = json_shape_problem(value[key], inner.shape if isinstance(inner, MayLack) else inner, inside)
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{at} is {_json_kind(value)}, expected a list"
        return next(
            (p for i, item in enumerate(value) if (p := json_shape_problem(item, shape[0], f"{where}[{i}]"))), None
        )
    if shape is object or (isinstance(value, shape) and not (shape is int and isinstance(value, bool))):
        return None
    return f"{at} is {_json_kind(value)}, expected {JSON_TYPES[shape]}"


def truncate_metrics(run_dir: Path, keep_before_step: int, source: Path | None = None) -> int:
    """Keep only records with step < keep_before_step (atomically): of run_dir's own metrics.jsonl, or of
    the run directory `source`'s (a fork's records, its source's up to the fork). Returns how many were
    dropped. Only the directory's RunLock holder may call it."""
    records = read_metrics(run_dir if source is None else source)
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
    return {"updated_at": time.time(), **writer_identity()}


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
    **dict.fromkeys(("reason", "process"), (lambda v: v is None or _is_text(v), "a string or null")),
    **dict.fromkeys(("host", "plot_error", "task"), (_is_text, "a string")),
    **dict.fromkeys(("pid", "step", "steps", "nonfinite_steps"), (_is_count, "an integer >= 0")),
    "resumed_from": (lambda v: v is None or _is_count(v), "an integer >= 0 or null"),
    **dict.fromkeys(("updated_at", "started_at", "wall_time", "steps_per_sec"), (_is_number, "a number")),
    **dict.fromkeys(("final", "best", "references"), (_is_figures, "a mapping of numbers")),
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


def is_finite_number(value) -> bool:
    """A metric value that can be drawn or averaged: an int or float (not a
    bool), finite. Records store non-finite and meaningless values as null."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a metric, non-finite and missing values dropped."""
    pairs = [(r["step"], r[key]) for r in records if is_finite_number(r.get(key))]
    if not pairs:
        return np.array([]), np.array([])
    steps, values = zip(*pairs)
    return np.asarray(steps), np.asarray(values, dtype=float)


ROBUST_QUANTILES = (0.05, 0.95)
ROBUST_PAD = 0.25  # the robust range is widened by this fraction of its span each way


def robust_limits(arrays: list, log: bool, robust: bool = True) -> tuple[float, float] | None:
    """y limits of the finite (on a log axis, positive)
    values in arrays, with a 5% margin; None if there is none.

    A diverged run's values grow by orders of magnitude
    before they stop being finite; an axis holding all of them flattens every
    other curve to a line. The y range is taken from the bulk of the drawn
    values: their quantiles Q(0.05)..Q(0.95) (in log10 on a log axis), widened
    by ROBUST_PAD of that span each way and never beyond the values' own
    min..max, then a 5% margin. On a log axis only the top is cut (values
    are positive there and diverge upward; the smallest loss is always shown). robust=False holds every value.
    """
    values = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays]) if len(arrays) else np.array([])
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    if not len(values):
        return None
    if log:
        values = np.log10(values)
    low, high = float(values.min()), float(values.max())
    if robust and len(values) >= 5:
        q_low, q_high = (float(q) for q in np.quantile(values, ROBUST_QUANTILES))
        pad = ROBUST_PAD * (q_high - q_low)
        low, high = (low if log else max(low, q_low - pad)), min(high, q_high + pad)
    if log:
        span = max(high - low, 0.1)
        return 10 ** (low - 0.05 * span), 10 ** (high + 0.05 * span)
    span = high - low or max(abs(high), 1.0) * 0.1
    return low - 0.05 * span, high + 0.05 * span
