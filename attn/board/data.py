"""What the board shows: the runs and experiments under the served PATHs, as
JSON-ready dicts, each run re-read only when one of its files changes.

Runs are found and read by attn.analysis.grouping (find_run_dirs, load_runs), as
`attn compare` reads them; groups are grouping.group_runs's (the seeds of one
setting); the table's setting columns are the keys that differ between the
runs (grouping.table_keys: bookkeeping keys left out, seed last), named by
grouping.short_names; its figures are grouping.run_figures's, plus the best
eval accuracy. A run's status is re-derived at every look
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
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from attn.analysis import grouping
from attn.analysis.outcomes import (
    THRESHOLD,  # eval accuracy of the `steps to 99%` column (compare's default --threshold)
)
from attn.report import compare_figure
from attn.store import locks, runs
from attn.train import figures

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")  # a run is re-read when one of these changes
FIGURE_SUFFIX = ".png"
REPORT_NAME = "report.md"
SERVED_SUFFIXES = (".png", ".svg", ".md", ".csv", ".json", ".jsonl", ".yaml", ".txt")
FILES_PREFIX = "files/"  # URLs of served files: files/<root index>/<path below the root>


class NotFound(LookupError):
    """No such run, or no file the board serves at that path; str() is the one-line message."""


@dataclass(frozen=True)
class _Read:
    """One run directory as last read, and the signature of its files then."""

    signature: tuple
    run: grouping.Run | None  # None: unreadable (skipped)
    skipped: grouping.Skipped | None
    figures: dict  # the table's figures (run_figures)
    logged: frozenset  # metric keys of its records


def to_json(payload) -> str:
    """Standard JSON (non-finite numbers as null, as the run files store them), with `<` escaped
    so that it can stand inside a <script> element."""
    return json.dumps(runs._json_safe(payload), allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def _signature(run_dir: Path) -> tuple:
    """(mtime, size) of each RUN_FILES file, None where absent: any write changes it."""
    signature = []
    for name in RUN_FILES:
        try:
            stat = (run_dir / name).stat()
            signature.append((stat.st_mtime_ns, stat.st_size))
        except OSError:
            signature.append(None)
    return tuple(signature)


def table_figures(run: grouping.Run) -> dict:
    """Final and best eval loss and accuracy, steps to THRESHOLD accuracy (None where the run has none)."""
    figures = grouping.run_figures(run, THRESHOLD)
    _, accuracies = runs.series(run.records, "eval_accuracy")
    return {"final_eval_loss": figures["final_eval_loss"], "best_eval_loss": figures["best_eval_loss"],
            "final_eval_accuracy": figures["final_eval_accuracy"],
            "best_eval_accuracy": float(accuracies.max()) if len(accuracies) else None,
            "steps_to_99": figures["steps_to_threshold"]}


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
            raise runs.RunError(f"{', '.join(map(str, paths))}: no directory to show; expected run directories, "
                                "directories of runs (e.g. runs), or globs of them")
        self.title = " ".join(map(str, paths))
        self._real_roots = [root.resolve() for root in self.roots]
        self._reads: dict[Path, _Read] = {}
        self._located: dict[str, tuple[int, Path]] = {}  # run id -> (root index, run directory)
        self._lock = threading.Lock()  # the reads and the located runs
        self._draw_lock = threading.Lock()  # one plot_run at a time: write_atomic's temporary names are per process

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
        try:
            names = sorted((p.name for p in directory.iterdir()  # as find_run_dirs, symbolic links are not followed
                            if p.suffix == FIGURE_SUFFIX and not p.name.startswith(".") and not p.is_symlink()
                            and p.is_file()),
                           key=grouping.natural_key)
        except OSError:
            return []
        return [{"name": name, "url": self._url(directory_id, name)} for name in names]

    # ----------------------------------------------------------------- reading
    def _scan(self) -> tuple[list[tuple[int, Path]], list[grouping.Skipped]]:
        """(root index, run directory) of every run under the roots, each once; the roots holding none."""
        found, seen, notes = [], set(), list(self._not_dirs)
        for index, root in enumerate(self.roots):
            try:
                run_dirs, _ = grouping.find_run_dirs([root])
            except runs.RunError as err:  # no run below it (yet): the page says so and shows them when they come
                notes.append(grouping.Skipped(root, str(err).removeprefix(f"{root}: ")))
                continue
            for run_dir in run_dirs:
                if run_dir.resolve() not in seen:
                    seen.add(run_dir.resolve())
                    found.append((index, run_dir))
        self._located = {self._id(index, run_dir): (index, run_dir) for index, run_dir in found}
        present = {run_dir for _, run_dir in found}
        self._reads = {run_dir: read for run_dir, read in self._reads.items() if run_dir in present}  # removed runs
        return found, notes

    def _read(self, run_dir: Path) -> _Read:
        """The run as on disk now: re-read if its files changed since the last look, its status re-derived."""
        signature = _signature(run_dir)
        read = self._reads.get(run_dir)
        if read is None or read.signature != signature:
            loaded, skipped = grouping.load_runs([run_dir])
            if skipped:
                read = _Read(signature, None, skipped[0], {}, frozenset())
            else:
                run = loaded[0]
                read = _Read(signature, run, None, table_figures(run),
                             frozenset(k for record in run.records for k in record) - {"step"})
            self._reads[run_dir] = read
        if read.run is None:
            return read
        status = locks.effective_status(read.run.summary or None)
        return dataclasses.replace(read, run=dataclasses.replace(read.run, status=status))

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
            found, notes = self._scan()
            reads = [(index, self._read(run_dir)) for index, run_dir in found]
        notes += [read.skipped for _, read in reads if read.skipped]
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
            experiment = self._experiment(index, run.path, experiments)
            if experiment is not None:
                experiment["runs"].append(run_id)
            used = grouping.used_settings(run.settings, list(run.settings))
            last = run.records[-1] if run.records else {}
            entries.append({
                "id": run_id, "name": self._name(index, run.path), "path": str(run.path),
                "status": run.status, "group": group_of[id(run)],
                "experiment": experiment["id"] if experiment else None,
                "step": last.get("step"), "steps": run.settings.get("train.steps"),
                "n_records": len(run.records), "updated_at": run.summary.get("updated_at"),
                "reason": run.summary.get("reason"),
                "settings": {k: grouping.format_value(v) for k, v in used.items()},  # as `attn runs` prints them
                "values": used,  # as in config.yaml, for the filter's numeric comparisons
                **read.figures,
                "figures": self._figures(run_id, run.path),
            })
        return {
            "title": self.title,
            "threshold": THRESHOLD,
            "wide_range": compare_figure.WIDE_RANGE,
            "columns": [{"key": k, "name": names[k]} for k in keys],
            "metrics": metrics,
            "runs": entries,
            "groups": [{"id": group_id(g), "label": g.label, "runs": [run_ids[id(r)] for r in g.runs],
                        "statuses": dict(sorted(Counter(r.status for r in g.runs).items()))}
                       for g in groups],
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
                experiments[directory] = {"id": experiment_id, "name": self._name(index, directory),
                                          "path": str(directory), "report": text,
                                          "report_url": self._url(experiment_id, REPORT_NAME) if text else None,
                                          "figures": self._figures(experiment_id, directory), "runs": []}
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
        return {"run": run_id, "status": read.run.status, "total": len(records), "start": start, "reset": reset,
                "records": records[start:]}

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
