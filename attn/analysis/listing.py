"""`attn runs`: the runs at or below a directory, one row each: status, task, the settings
that differ between them, final figures and age.

    python -m attn runs [PATH] [--status S] [--experiment NAME]

Runs are found and read as attn.analysis.grouping finds and reads them; a run's
status is its effective one (locks.effective_status: `stale` for a
`running` run whose process is gone), its settings those its task reads.
"""

from __future__ import annotations

import math
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from attn import outcomes
from attn.analysis.grouping import (
    Run,
    final_figures,
    load_runs,
    natural_key,
    short_names,
    table_keys,
    used_settings,
    walk_runs,
)
from attn.config.yamlio import ArgumentError
from attn.store import runs

LIST_STATUSES = runs.STATUSES + ("stale", "unknown")
RUNS_ROOT = Path("runs")


@dataclass(frozen=True)
class ListedRun:
    name: str  # path below the listed directory
    status: str
    task: str
    settings: dict  # Listing.keys that the run's task reads -> value
    final: tuple  # (eval loss, eval accuracy) last logged, (None, None) after a divergence
    age: float | None  # seconds since the last heartbeat (or since config.yaml was written)
    disk: int = 0  # bytes the run directory takes on disk (runs.disk_use)
    outcome: str | None = None  # attn.outcomes' class once the run has ended


@dataclass(frozen=True)
class Listing:
    keys: list  # dotted keys that differ between the runs listed
    names: dict  # dotted key -> short column name
    rows: list  # list[ListedRun]
    skipped: list  # list[Skipped]


def list_runs(
    path: Path = RUNS_ROOT, status: str | None = None, experiment: str | None = None, outcome: str | None = None
) -> Listing:
    """The runs at or below path (or path/experiment), optionally only those with an effective status
    and only those that ended with an outcome class (attn.outcomes)."""
    root = Path(path)
    if not root.is_dir():
        raise runs.RunError(f"{root}: no such directory; expected a directory of runs (default {RUNS_ROOT})")
    if status is not None and status not in LIST_STATUSES:
        raise ArgumentError("status", f"got {status!r}; expected one of {', '.join(LIST_STATUSES)}")
    if outcome is not None and outcome not in outcomes.OUTCOMES:
        raise ArgumentError("outcome", f"got {outcome!r}; expected one of {', '.join(outcomes.OUTCOMES)}")
    base = root
    if experiment is not None:
        base = root / experiment
        parts = Path(experiment).parts
        outside = not parts or Path(experiment).is_absolute() or ".." in parts  # NAME is a directory under PATH
        if outside or not base.is_dir() or (base / "config.yaml").exists():
            known = [
                c.name
                for c in sorted(root.iterdir(), key=lambda c: natural_key(c.name))
                if c.is_dir() and not c.name.startswith(".") and not (c / "config.yaml").exists() and walk_runs(c)
            ]
            raise ArgumentError(
                "experiment",
                f"got {experiment!r}; expected a directory of runs under {root}: "
                f"{', '.join(known) or 'there are none'}",
            )
    loaded, skipped = load_runs(walk_runs(base), last_record_only=True)  # the last record is all a row shows
    if status is not None:
        loaded = [run for run in loaded if run.status == status]
    classes = {run.path: outcome_of(run) for run in loaded}
    if outcome is not None:
        loaded = [run for run in loaded if classes[run.path] == outcome]
    keys = [k for k in table_keys(loaded) if k != "task.name"]  # the task has its own column
    now = time.time()
    rows = [
        ListedRun(
            name=str(run.path.relative_to(root)) if run.path != root else run.path.name,
            status=run.status,
            task=str(run.settings.get("task.name", "?")),
            settings=used_settings(run.settings, keys),
            final=final_figures(run),
            age=now
            - (
                run.summary["updated_at"]
                if runs.is_finite_number(run.summary.get("updated_at"))
                else (run.path / "config.yaml").stat().st_mtime
            ),
            disk=runs.disk_use(run.path),
            outcome=classes[run.path],
        )
        for run in loaded
    ]
    return Listing(keys, short_names(keys, among=[k for run in loaded for k in run.settings]), rows, skipped)


def outcome_of(run: Run) -> str | None:
    """The run's outcome class: its summary's, or, for a run that ended before runs named theirs, from
    its eval curve streamed past (three numbers a record kept: a listing's memory stays small)."""
    if run.status not in outcomes.ENDED or run.said_outcome is not None:
        return run.said_outcome
    steps, accuracy, loss = array("q"), array("d"), array("d")
    for record in runs.iter_metrics(run.path):
        steps.append(record["step"])
        accuracy.append(_number(record.get("eval_accuracy")))
        loss.append(_number(record.get("eval_loss")))
    ended = outcomes.of_curve(steps, accuracy, loss, {**run.summary, "status": run.status})
    return None if ended is None else ended.outcome


def _number(value) -> float:
    return float(value) if runs.is_finite_number(value) else math.nan


def format_age(seconds: float | None) -> str:
    """Like ls: 42s, 12m, 5h, 3d."""
    if seconds is None:
        return "—"
    for unit, size, limit in (("s", 1, 90), ("m", 60, 90 * 60), ("h", 3600, 36 * 3600)):
        if seconds < limit:
            return f"{max(seconds, 0) / size:.0f}{unit}"
    return f"{seconds / 86400:.0f}d"
