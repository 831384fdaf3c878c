"""What the board shows: the runs and experiments under the served PATHs, as
JSON-ready dicts, each run re-read only when one of its files changes.

Runs are found and read by attn.analysis.grouping (find_run_dirs, load_runs), as
`attn compare` reads them; groups are grouping.group_runs's (the seeds of one
setting); the table's setting columns are the keys that differ between the
runs (grouping.table_keys: bookkeeping keys left out, seed last), named by
grouping.short_names; its figures are grouping.run_figures's, plus the best
eval accuracy; its `ends` give each logged metric's final and best value over
every record (the page's hyperparameter views). A run's status is re-derived at every look
(locks.effective_status), so a `running` run whose process died turns
`stale` without any file changing.

Roots and names. Each PATH is a root (a glob is expanded once, when the
board starts; a plain file among them is listed as skipped). A run or
experiment directory has an id, `<root index>/<path below the root>`
(stable while the board runs), and a name: its path below the root, or
below the roots' parent directory when there are several roots.

Experiments. An experiment is a directory at or below a root that directly
holds run directories and has a report.md or is not itself a root: runs/
of hand-trained runs is no experiment, runs/sqrt_dk/ is one.

Files. resolve_file maps `<root index>/<path>` to a file under that root,
refusing `.` and `..` segments, hidden names (.lock, write_atomic's
temporaries), symbolic links that lead out of the root, and any suffix
outside SERVED_SUFFIXES.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import stat as stat_module
import threading
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from attn import outcomes
from attn.analysis import grouping
from attn.outcomes import (
    THRESHOLD,  # eval accuracy of the `steps to 99%` column (compare's default --threshold)
)
from attn.report import compare_figure
from attn.store import locks, runs
from attn.text import format_value
from attn.train import figures

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")  # a run is re-read when one of these changes
MAX_POINTS = 2000  # a run's records as served: at most 2 * MAX_POINTS (+ the newest), about what a chart can show
FIGURE_SUFFIX = ".png"
REPORT_NAME = "report.md"
SERVED_SUFFIXES = (".png", ".svg", ".md", ".csv", ".json", ".jsonl", ".yaml", ".txt")
FILES_PREFIX = "files/"  # URLs of served files: files/<root index>/<path below the root>
MAX_FILE_BYTES = 512 << 20  # a file the board serves, or its static export copies: at most this large
HIGHER_IS_BETTER = (
    "accuracy",
)  # a metric whose name holds one of these is best at its highest; any other at its lowest


class NotFound(LookupError):
    """No such run, or no file the board serves at that path; str() is the one-line message."""


class TooLarge(Exception):
    """A file the board would serve that is larger than MAX_FILE_BYTES; str() is the one-line message."""


def open_file(path: Path) -> tuple[typing.BinaryIO, int]:
    """A file under a served root (Board.resolve_file's) opened to be streamed, never read whole: no symbolic
    link at the end, a regular file, of at most MAX_FILE_BYTES; (its handle, its size). NotFound or TooLarge."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise NotFound(f"{path.name}: cannot read: {err.strerror}") from None
    facts = os.fstat(fd)
    if not stat_module.S_ISREG(facts.st_mode):
        os.close(fd)
        raise NotFound(f"{path.name}: not a regular file")
    if facts.st_size > MAX_FILE_BYTES:
        os.close(fd)
        raise TooLarge(f"{path.name}: {facts.st_size} bytes; the board serves files of at most {MAX_FILE_BYTES}")
    return os.fdopen(fd, "rb"), facts.st_size


@dataclass(frozen=True)
class _Read:
    """One run directory as last read, and the signature of its files then."""

    signature: tuple
    run: grouping.Run | None  # None: unreadable (skipped)
    skipped: grouping.Skipped | None
    figures: dict  # the table's figures (run_figures)
    logged: frozenset  # metric keys of its records
    metrics: "_Metrics | None" = None  # metrics.jsonl as streamed (continued from where it was when it grew)
    n_logged: int = 0  # records in metrics.jsonl (run.records holds them all, or a downsampled MAX_POINTS)
    ends: dict = dataclasses.field(default_factory=dict)  # each metric's final and best (_Metrics.end_figures)
    outcome: dict = dataclasses.field(default_factory=dict)  # outcome and outcome_said (_outcome), {} while it runs


def to_json(payload) -> str:
    """Standard JSON (non-finite numbers as null, as the run files store them), with `<` escaped
    so that it can stand inside a <script> element."""
    return json.dumps(runs._json_safe(payload), allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def _signature(run_dir: Path) -> tuple:
    """(mtime, size, inode) of each RUN_FILES file, None where absent: any write changes it."""
    signature, directory = [], str(run_dir)
    for name in RUN_FILES:
        try:
            stat = os.stat(os.path.join(directory, name), follow_symlinks=False)
            signature.append((stat.st_mtime_ns, stat.st_size, stat.st_ino))
        except OSError:
            signature.append(None)
    return tuple(signature)


def _mtime(path: Path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _walk(root: Path) -> list[tuple[str, str]]:
    """(run directory, its path below root) of every run at or below root, as grouping.walk_runs
    finds them (a directory holding config.yaml; below it nothing; hidden names and symbolic links
    skipped; natural order), with one scandir per directory; RunError for one it cannot list."""
    root = str(root)
    if os.path.isfile(os.path.join(root, "config.yaml")):
        return [(root, "")]
    found = []

    def visit(directory: str, relative: str) -> None:
        try:
            with os.scandir(directory) as entries:
                children = sorted(
                    (e.name for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)),
                    key=grouping.natural_key,
                )
        except OSError as err:
            raise runs.RunError(f"{directory}: cannot list: {err.strerror}") from None
        for name in children:
            child, below = os.path.join(directory, name), f"{relative}/{name}" if relative else name
            if os.path.isfile(os.path.join(child, "config.yaml")):
                found.append((child, below))
            else:
                visit(child, below)

    if os.path.isdir(root):
        visit(root, "")
    return found


class _Metrics:
    """A run's metrics.jsonl read as a stream with bounded memory, checked line by line as
    runs.read_metrics checks it (RunError naming the first bad line; a torn last line waits).

    Downsampled as it is read: every stride-th record is kept (stride 1 until more than
    2 * MAX_POINTS are kept, then doubled, dropping every other one), plus the newest one,
    so a file of any size becomes at most about 2 * MAX_POINTS evenly spaced records with
    the last one exact. The table's figures (best eval loss and accuracy, first step at the
    threshold) are taken over every record as it passes. When the file grows (same inode,
    same first bytes) reading continues from where it stopped."""

    HEAD = 256  # bytes that identify the file: a rewritten file (a resume from an earlier checkpoint) differs

    def __init__(self, path: Path):
        self.path = path
        self.offset, self.count, self.stride, self.last_step = 0, 0, 1, -1
        self.kept: list[dict] = []
        self.newest: dict | None = None
        self.logged: set = set()
        self.best_loss = self.best_accuracy = self.steps_to = None
        # per key, over every record (end_figures): its value in the last record holding it; the last
        # finite one and its step; the step of the last null; the lowest and highest finite values
        self.finals, self.lasts, self.last_steps, self.null_steps, self.lows, self.highs = {}, {}, {}, {}, {}, {}
        self.identity = None

    def _open(self):
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return None
        except OSError as err:
            raise runs.RunError(f"{self.path}: metrics file: cannot read: {runs.describe_os_error(err)}") from None
        stat = os.fstat(fd)
        if not stat_module.S_ISREG(stat.st_mode):
            os.close(fd)
            raise runs.RunError(f"{self.path}: metrics file: not a regular file")
        return os.fdopen(fd, "rb")

    def update(self) -> "_Metrics":
        """This stream continued to the file's end, or a new one when the file was replaced."""
        file = self._open()
        if file is None:
            return _Metrics(self.path)
        with file:
            stat = os.fstat(file.fileno())
            head = file.read(self.HEAD)
            identity = (stat.st_ino, head if len(head) < self.HEAD else hashlib.sha1(head).digest())
            if self.identity is not None and (
                identity[0] != self.identity[0]
                or stat.st_size < self.offset
                or (self.offset >= self.HEAD and identity != self.identity)
            ):
                fresh = _Metrics(self.path)
                fresh._read(file, identity)
                return fresh
            self._read(file, identity)
            return self

    def _read(self, file, identity) -> None:
        self.identity = identity
        file.seek(self.offset)
        number = self.count_lines
        for line in file:
            if not line.endswith(b"\n"):
                break  # the last line, perhaps torn mid-append: read again when the file grows
            number += 1
            self.offset += len(line)
            self.count_lines = number
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                what = "UTF-8 text" if isinstance(err, UnicodeDecodeError) else "JSON"
                raise runs.RunError(f"{self.path}: line {number} is not {what}; {runs.REPAIR_METRICS}") from None
            problem = runs._record_problem(record, self.last_step)  # the same checks as runs.read_metrics
            if problem:
                raise runs.RunError(f"{self.path}: line {number} {problem}; {runs.REPAIR_METRICS}")
            self._add(record)

    count_lines = 0

    def _track_ends(self, record: dict) -> None:
        """Each key's end, as one tight loop: a huge file passes here record by record."""
        step = record["step"]
        finals, lasts, last_steps, lows, highs = self.finals, self.lasts, self.last_steps, self.lows, self.highs
        for key, value in record.items():
            finals[key] = value
            kind = value.__class__
            if value is None or not (kind is float or kind is int) or (kind is float and not math.isfinite(value)):
                self.null_steps[key] = step  # null in the file: not finite (or meaningless)
                continue
            lasts[key] = value
            last_steps[key] = step
            if key not in lows:
                lows[key] = highs[key] = value
            elif value < lows[key]:
                lows[key] = value
            elif value > highs[key]:
                highs[key] = value

    def _add(self, record: dict) -> None:
        self.last_step = record["step"]
        self.logged.update(record)
        self._track_ends(record)
        loss, accuracy = record.get("eval_loss"), record.get("eval_accuracy")
        if runs.is_finite_number(loss) and (self.best_loss is None or loss < self.best_loss):
            self.best_loss = float(loss)
        if runs.is_finite_number(accuracy):
            if self.best_accuracy is None or accuracy > self.best_accuracy:
                self.best_accuracy = float(accuracy)
            if self.steps_to is None and accuracy >= THRESHOLD:
                self.steps_to = int(record["step"])
        if self.count % self.stride == 0:
            self.kept.append(record)
            if len(self.kept) > 2 * MAX_POINTS:
                self.kept, self.stride = self.kept[::2], self.stride * 2
        self.newest = record
        self.count += 1

    def records(self) -> list[dict]:
        """The kept records, and the newest if it is not one of them."""
        if self.newest is not None and (not self.kept or self.kept[-1] is not self.newest):
            return [*self.kept, self.newest]
        return list(self.kept)

    def end_figures(self) -> dict:
        """Each logged metric's end, over every record read (for the board's hyperparameter views):
        final, its value in the last record holding it (None when not finite: null in the file),
        at `step`; best, the lowest finite value (the highest for HIGHER_IS_BETTER metrics); and
        when final is not finite, the last finite value and its step."""
        shown = {}
        for key, final in self.finals.items():
            if key == "step":
                continue
            finite = key in self.lasts and self.last_steps[key] >= self.null_steps.get(key, -1)
            entry = {
                "final": final if finite else None,
                "step": self.last_steps[key] if finite else self.null_steps[key],
                "best": (self.highs if best_is_highest(key) else self.lows).get(key),
            }
            if not finite:
                entry.update(last_finite=self.lasts.get(key), last_finite_step=self.last_steps.get(key))
            shown[key] = entry
        return shown

    def figures(self, run: grouping.Run) -> dict:
        """Final and best eval loss and accuracy and the steps to THRESHOLD accuracy, the best and the step
        at the threshold over every record read (a downsampled run's kept records would miss them)."""
        final_loss, final_accuracy = grouping.final_figures(run)
        return {
            "final_eval_loss": final_loss,
            "best_eval_loss": self.best_loss,
            "final_eval_accuracy": final_accuracy,
            "best_eval_accuracy": self.best_accuracy,
            "steps_to_99": self.steps_to,
        }


def _outcome(run: grouping.Run) -> dict:
    """The run's outcome class and its words: summary.json's where grouping.Run.said_outcome takes it (as
    compare and `attn runs` do), else attn.outcomes.of_run of the records held (an older run; a downsampled
    one's kept records); {} while it has not ended."""
    said = run.said_outcome
    if said is not None:
        words = run.summary.get("outcome_said")
        return {"outcome": said, "outcome_said": words if isinstance(words, str) and words else said}
    if run.status not in outcomes.ENDED:
        return {}
    try:
        found = outcomes.of_run(run.records, {**run.summary, "status": run.status})
    except (ValueError, KeyError, TypeError):  # records or summary that cannot be classified: no outcome shown
        return {}
    return {} if found is None else {"outcome": found.outcome, "outcome_said": found.said()}


def best_is_highest(metric: str) -> bool:
    """Whether a metric is best at its highest value (HIGHER_IS_BETTER), else at its lowest."""
    return any(word in metric for word in HIGHER_IS_BETTER)


def group_id(group: grouping.Group) -> str:
    """A group's id, stable while runs come and go: a digest of its shared settings."""
    return "g" + hashlib.sha1(grouping.canonical(group.settings).encode()).hexdigest()[:12]


class Board:
    """The runs and experiments under some PATHs. Safe to use from several threads."""

    def __init__(self, paths):
        expanded = grouping.expand_paths(paths)  # RunError for a PATH that is neither there nor a matching glob
        self.roots = [p for p in expanded if p.is_dir()]
        self._not_dirs = [grouping.Skipped(p, grouping.NOT_A_RUN) for p in expanded if not p.is_dir()]
        if not self.roots:
            raise runs.RunError(
                f"{', '.join(map(str, paths))}: no directory to show; expected run directories, "
                "directories of runs (e.g. runs), or globs of them"
            )
        self.title = " ".join(map(str, paths))
        self._real_roots = [root.resolve() for root in self.roots]
        self._reads: dict[Path, _Read] = {}
        self._located: dict[str, tuple[int, Path]] = {}  # run id -> (root index, run directory)
        self._lock = threading.Lock()  # the reads and the located runs
        self._draw_lock = threading.Lock()  # one plot_run at a time: write_atomic's temporary names are per process
        self._paths: dict[str, Path] = {}  # each run directory's Path, made once
        self._run_ids: dict[Path, str] = {}
        self._listings: dict[Path, tuple] = {}  # directory -> (its mtime, its figure names)
        self._snapshot: tuple[str, bytes] | None = None  # (ETag, JSON) of the last snapshot built
        self._snapshot_key = None

    # ----------------------------------------------------------------- names
    def _id(self, index: int, directory: Path) -> str:
        relative = directory.relative_to(self.roots[index]).as_posix()
        return str(index) if relative == "." else f"{index}/{relative}"

    def _name(self, index: int, directory: Path) -> str:
        base = self.roots[index] if len(self.roots) == 1 else self.roots[index].parent
        name = directory.relative_to(base).as_posix()
        return directory.resolve().name if name == "." else name

    def _url(self, directory_id: str, file_name: str) -> str:
        return FILES_PREFIX + quote(f"{directory_id}/{file_name}")

    def _figures(self, directory_id: str, directory: Path) -> list[dict]:
        mtime = _mtime(directory)  # a figure written (write_atomic renames it in) changes its directory's mtime
        held = self._listings.get(directory)
        if held is not None and held[0] == mtime and mtime is not None:
            names = held[1]
        else:
            try:
                names = sorted(
                    (
                        p.name
                        for p in directory.iterdir()  # as find_run_dirs, symlinks are not followed
                        if p.suffix == FIGURE_SUFFIX
                        and not p.name.startswith(".")
                        and not p.is_symlink()
                        and p.is_file()
                    ),
                    key=grouping.natural_key,
                )
            except OSError:
                names = []
            self._listings[directory] = (mtime, names)
        return [{"name": name, "url": self._url(directory_id, name)} for name in names]

    # ----------------------------------------------------------------- reading
    def _scan(self) -> tuple[list[tuple[int, Path]], list[grouping.Skipped]]:
        """(root index, run directory) of every run under the roots, each once; the roots holding none."""
        found, seen, notes = [], set(), list(self._not_dirs)
        for index, root in enumerate(self.roots):
            try:
                run_dirs = _walk(root)
                if not run_dirs:
                    grouping.find_run_dirs([root])  # its RunError says why, as `attn compare` says it
            except runs.RunError as err:  # no run below it (yet): the page says so and shows them when they come
                notes.append(grouping.Skipped(root, str(err).removeprefix(f"{root}: ")))
                continue
            real_root = str(self._real_roots[index])
            for run_dir, relative in run_dirs:  # below a root no symbolic link is followed: its real path is this
                real = os.path.join(real_root, relative) if relative else real_root
                if real not in seen:
                    seen.add(real)
                    found.append((index, self._paths.setdefault(run_dir, Path(run_dir))))
        self._located = {
            self._run_ids.get(run_dir) or self._run_ids.setdefault(run_dir, self._id(index, run_dir)): (index, run_dir)
            for index, run_dir in found
        }
        present = {run_dir for _, run_dir in found}
        self._reads = {run_dir: read for run_dir, read in self._reads.items() if run_dir in present}  # removed runs
        return found, notes

    def _read(self, run_dir: Path) -> _Read:
        """The run as on disk now: re-read if its files changed since the last look, its status re-derived."""
        signature = _signature(run_dir)
        read = self._reads.get(run_dir)
        if read is None or read.signature != signature:
            read = self._load(run_dir, signature, read)
            self._reads[run_dir] = read
        if read.run is None:
            return read
        status = locks.effective_status(read.run.summary or None)
        if status == read.run.status:
            return read
        return dataclasses.replace(read, run=dataclasses.replace(read.run, status=status))

    def _load(self, run_dir: Path, signature: tuple, held: _Read | None) -> _Read:
        """The run read again: config and summary if they changed, metrics.jsonl streamed on from
        where it was (_Metrics); a damaged file makes it skipped, with the reason, as load_runs says it."""
        try:
            if held is not None and held.run is not None and held.signature[0] == signature[0]:
                settings = held.run.settings
            else:
                settings = grouping.flatten_config(runs.read_config_dict(run_dir))
            stream = (
                held.metrics if held is not None and held.metrics is not None else _Metrics(run_dir / "metrics.jsonl")
            ).update()
            summary = runs.read_summary(run_dir) or {}
        except runs.RunError as err:
            reason = " ".join(str(err).removeprefix(f"{run_dir}/").split())
            return _Read(signature, None, grouping.Skipped(run_dir, reason), {}, frozenset())
        run = grouping.Run(run_dir, settings, stream.records(), summary, locks.effective_status(summary or None))
        return _Read(
            signature,
            run,
            None,
            stream.figures(run),
            frozenset(stream.logged - {"step"}),
            stream,
            stream.count,
            stream.end_figures(),
            _outcome(run),
        )

    def _locate(self, run_id: str) -> tuple[int, Path]:
        if run_id not in self._located:
            self._scan()  # a run that appeared since the last look
        if run_id not in self._located:
            raise NotFound(f"run {run_id!r}: no such run under {self.title}")
        return self._located[run_id]

    # ----------------------------------------------------------------- what the page asks for
    def snapshot(self, with_records: bool = False) -> dict:
        """Every run (status, settings, table figures, figures), group and experiment; with_records:
        also `records`, every run's records by run id (the static export; the server sends them by
        records())."""
        with self._lock:
            reads, notes = self._gather()
            return self._build(reads, notes, with_records)

    def snapshot_json(self) -> tuple[str, bytes]:
        """(ETag, to_json(snapshot())), built only when something it shows changed since the last
        call: the ETag is a digest of what the snapshot is made from (each run directory's files'
        mtimes, sizes and inodes, its status, its directory's mtime, its experiment's report),
        so a poll that finds nothing new costs a walk and a few stat calls per run."""
        with self._lock:
            reads, notes = self._gather()
            paths = [str(read.run.path if read.run else read.skipped.path) for _, read in reads]
            parents = sorted({os.path.dirname(p) for p in paths})
            key = (
                tuple(
                    (index, path, read.signature, read.run.status if read.run else None, _mtime(path))
                    for (index, read), path in zip(reads, paths)
                ),
                tuple((p, _mtime(p), _mtime(os.path.join(p, REPORT_NAME))) for p in parents),
                tuple((str(n.path), n.reason) for n in notes),
            )
            if self._snapshot is None or key != self._snapshot_key:
                content = to_json(self._build(reads, notes, False)).encode()
                digest = hashlib.sha1(repr(key).encode()).hexdigest()
                self._snapshot, self._snapshot_key = ('"' + digest + '"', content), key
            return self._snapshot

    def _gather(self) -> tuple[list, list]:
        found, notes = self._scan()
        return [(index, self._read(run_dir)) for index, run_dir in found], notes

    def _build(self, reads: list, notes: list, with_records: bool) -> dict:
        notes = notes + [read.skipped for _, read in reads if read.skipped]
        loaded = [(index, read) for index, read in reads if read.run]
        all_runs = [read.run for _, read in loaded]
        run_ids = {id(read.run): self._id(index, read.run.path) for index, read in loaded}
        keys = grouping.table_keys(all_runs)
        names = grouping.short_names(keys, among=[k for run in all_runs for k in run.settings])
        groups = grouping.group_runs(all_runs)
        group_of = {id(run): group_id(group) for group in groups for run in group.runs}
        logged = set().union(*(read.logged for _, read in loaded))
        metrics = [m for m in compare_figure.DEFAULT_METRICS if m in logged]
        metrics += sorted(logged - set(metrics), key=grouping.natural_key)
        experiments: dict[Path, dict | None] = {}
        entries = []
        for index, read in loaded:
            run, run_id = read.run, run_ids[id(read.run)]
            downsampled = read.n_logged > len(run.records)
            experiment = self._experiment(index, run.path, experiments)
            if experiment is not None:
                experiment["runs"].append(run_id)
            used = grouping.used_settings(run.settings, list(run.settings))
            last = run.records[-1] if run.records else {}
            entries.append(
                {
                    "id": run_id,
                    "name": self._name(index, run.path),
                    "path": str(run.path),
                    "status": run.status,
                    "group": group_of[id(run)],
                    "experiment": experiment["id"] if experiment else None,
                    "step": last.get("step"),
                    "steps": run.settings.get("train.steps"),
                    # the page fetches records while it holds fewer than n_records: a downsampled run's
                    # records (_Metrics) are fetched again whenever the file changed
                    "n_records": read.n_logged if downsampled else len(run.records),
                    "n_logged": read.n_logged,
                    "downsampled": downsampled,
                    "updated_at": run.summary.get("updated_at"),
                    "reason": run.summary.get("reason"),
                    "outcome": read.outcome.get("outcome"),  # attn.outcomes' class; None while it runs
                    "outcome_said": read.outcome.get("outcome_said"),
                    # the task's plateau levels (chance, no retrieval) as the run wrote them: the chart's lines
                    "references": run.summary.get("references") or {},
                    "settings": {k: format_value(v) for k, v in used.items()},  # as `attn runs` prints them
                    "values": used,  # as in config.yaml, for the filter's numeric comparisons
                    **read.figures,
                    "ends": read.ends,  # each metric's final and best, for the hyperparameter views
                    "figures": self._figures(run_id, run.path),
                }
            )
        return {
            "title": self.title,
            "threshold": THRESHOLD,
            "wide_range": compare_figure.WIDE_RANGE,
            "log_metrics": compare_figure.LOG_METRICS,  # the y scale auto makes log, as compare's
            "best_highest": sorted(m for m in metrics if best_is_highest(m)),  # best at their highest; the rest lowest
            "columns": [{"key": k, "name": names[k]} for k in keys],
            "metrics": metrics,
            "runs": entries,
            "groups": [
                {
                    "id": group_id(g),
                    "label": g.label,
                    "runs": [run_ids[id(r)] for r in g.runs],
                    "statuses": dict(sorted(Counter(r.status for r in g.runs).items())),
                }
                for g in groups
            ],
            "experiments": [e for e in experiments.values() if e is not None],
            "skipped": [{"path": str(s.path), "reason": s.reason} for s in notes],
            **({"records": {run_ids[id(run)]: run.records for run in all_runs}} if with_records else {}),
        }

    def _experiment(self, index: int, run_dir: Path, experiments: dict) -> dict | None:
        """The experiment (module docstring) that run_dir belongs to, made on first sight; None if none."""
        if run_dir == self.roots[index]:
            return None
        directory = run_dir.parent
        if directory not in experiments:
            report = directory / REPORT_NAME
            if directory == self.roots[index] and not report.is_file():
                experiments[directory] = None
            else:
                experiment_id = self._id(index, directory)
                try:
                    text = report.read_text(errors="replace") if report.is_file() else None
                except OSError as err:
                    text = f"({report}: unreadable: {err.strerror})"
                experiments[directory] = {
                    "id": experiment_id,
                    "name": self._name(index, directory),
                    "path": str(directory),
                    "report": text,
                    "report_url": self._url(experiment_id, REPORT_NAME) if text else None,
                    "figures": self._figures(experiment_id, directory),
                    "runs": [],
                }
        return experiments[directory]

    def records(self, run_id: str, since: int = 0, last_step: int | None = None) -> dict:
        """The run's records from index `since` on (the client holds the first `since`, the last at
        step `last_step`); all of them, with reset true, when the file no longer starts with those
        (metrics.jsonl is rewritten when a run resumes from an earlier checkpoint)."""
        with self._lock:
            _, run_dir = self._locate(run_id)
            read = self._read(run_dir)
        if read.run is None:
            raise NotFound(f"run {run_id!r}: {read.skipped.reason}")
        records = read.run.records
        held_last = records[since - 1]["step"] if 0 < since <= len(records) else None
        reset = since > len(records) or (last_step is not None and held_last != last_step)
        start = 0 if reset else since
        return {
            "run": run_id,
            "status": read.run.status,
            "total": len(records),
            "start": start,
            "reset": reset,
            "n_logged": read.n_logged,
            "downsampled": read.n_logged > len(records),
            "records": records[start:],
        }

    def run_page(self, run_id: str) -> dict:
        """A run's page (GET /api/run?run=ID): its resolved config.yaml flattened to dotted keys
        (values as in the file), links to its files the board serves (config.yaml, metrics.jsonl,
        summary.json, figures) and its checkpoints by name and size (not served)."""
        with self._lock:
            _, run_dir = self._locate(run_id)
        try:
            config = grouping.flatten_config(runs.read_config_dict(run_dir))
        except runs.RunError as err:
            raise NotFound(f"run {run_id!r}: {err}") from None
        files = [{"name": name, "url": self._url(run_id, name)} for name in RUN_FILES if (run_dir / name).is_file()]
        files += self._figures(run_id, run_dir)
        checkpoints = []
        try:
            for entry in sorted(os.scandir(run_dir), key=lambda e: grouping.natural_key(e.name)):
                if (
                    entry.name.startswith("checkpoint")
                    and entry.name.endswith(".npz")
                    and entry.is_file(follow_symlinks=False)
                ):
                    checkpoints.append({"name": entry.name, "bytes": entry.stat(follow_symlinks=False).st_size})
        except OSError:
            pass
        return {"run": run_id, "path": str(run_dir), "config": config, "files": files, "checkpoints": checkpoints}

    def draw_figures(self, run_id: str) -> list[dict]:
        """Draw the run's figures into its directory (attn.train.figures.plot_run), holding
        the run's RunLock as every writer does (locks.RunLocked while another
        process writes it); its figures then."""
        with self._lock:
            index, run_dir = self._locate(run_id)
        with self._draw_lock, locks.RunLock(run_dir, "attn board: draw figures"):
            figures.plot_run(run_dir)
        return self._figures(run_id, run_dir)

    def resolve_file(self, path: str) -> Path:
        """The file at `<root index>/<path below the root>` (already URL-decoded), if the board serves it
        (module docstring); else NotFound."""
        index, *names = path.split("/")
        refused = NotFound(f"{path}: not a file the board serves")
        if not (index.isascii() and index.isdigit()) or int(index) >= len(self.roots) or not names:
            raise refused
        if any(n in ("", ".", "..") or n.startswith(".") or "\\" in n or "\0" in n for n in names):
            raise refused
        root = self._real_roots[int(index)]
        try:
            real = root.joinpath(*names).resolve(strict=True)
        except (OSError, RuntimeError):  # missing, or a symlink loop
            raise refused from None
        if not real.is_relative_to(root) or not real.is_file() or real.suffix.lower() not in SERVED_SUFFIXES:
            raise refused
        return real
