"""Compare runs: a table and an overlaid figure of their groups, written into one directory.

    python -m attn compare runs/sqrt_dk/*     figures and table into runs/sqrt_dk/compare/

Which runs are read and how they are grouped and labelled: attn.analysis.grouping
(--where, --group-by, --facet); the curves and their ± std bands:
attn.analysis.curves; the figure: attn.report.compare_figure.

Statistics. The table's figures (final and best eval loss, steps to the
threshold, wall time) are over the runs of a group that finished
(completed or diverged, runs.FINISHED): a run still going, stale, interrupted or
failed is drawn as far as it got, but its last figures are not final; the
table says how many runs each group left out, and --include-unfinished
counts them too.

Output. Figures and tables go to --out if given; else, when every run lies
directly in one directory (an experiment, or a runs_dir of hand-trained
runs), to <that directory>/compare, which the next comparison of the same
runs refreshes (its runs.json lists them); a comparison of other runs is
never written over it but goes to a new compare-<time> beside it, with a
warning naming both. Runs in several directories go to a new compare-<time>
directory in their deepest common directory. Only the runs' paths decide,
never the working directory.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attn.analysis.grouping import (
    THRESHOLD_METRIC,
    Group,
    Run,
    Skipped,
    duplicate_seeds,
    find_run_dirs,
    format_value,
    group_runs,
    load_runs,
    matches,
    natural_key,
    parse_where,
    plain_value,
    run_figures,
    short_names,
    unused_task_keys,
    used_settings,
    varying_keys,
)
from attn.config.schema import all_keys, nearest_key
from attn.config.yamlio import ArgumentError, closest, did_you_mean
from attn.outcomes import THRESHOLD
from attn.report.compare_figure import DEFAULT_METRICS, X_AXES, draw_comparison, shared_references
from attn.store import runs
from attn.text import markdown_table
from attn.train import figures

YSCALES = ("auto", "log", "linear")


# ---------------------------------------------------------------------------
# The summary table
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Stat:
    """mean ± sample std over the runs of a group that have a value."""

    mean: float | None
    std: float | None  # None with fewer than two values
    n: int  # runs with a value
    total: int  # runs in the group


def describe(values: list) -> Stat:
    finite = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not len(finite):
        return Stat(None, None, 0, len(values))
    std = float(finite.std(ddof=1)) if len(finite) > 1 else None
    return Stat(float(finite.mean()), std, len(finite), len(values))


STAT_COLUMNS = ("final_eval_loss", "final_eval_accuracy", "best_eval_loss", "steps_to_threshold", "wall_time")


@dataclass(frozen=True)
class GroupRow:
    label: str
    settings: dict  # the keys that differ between groups and that its task reads -> this group's values
    seeds: list
    statuses: dict  # effective status -> number of runs
    outcomes: dict  # outcome class (attn.outcomes) -> number of runs that ended so
    stats: dict  # STAT_COLUMNS -> Stat, over the runs counted
    left_out: int = 0  # runs drawn but not counted: they did not finish (module docstring, Statistics)


def group_rows(groups: list[Group], threshold: float, include_unfinished: bool = False) -> list[GroupRow]:
    """One row per group; its statistics over the runs that finished (all of them with include_unfinished)."""
    keys = varying_keys([g.settings for g in groups])
    rows = []
    for group in groups:
        counted = [run for run in group.runs if include_unfinished or run.status in runs.FINISHED]
        figures = [run_figures(run, threshold) for run in counted]
        rows.append(
            GroupRow(
                label=group.name,
                settings=used_settings(group.settings, keys),
                seeds=[run.settings.get("seed") for run in group.runs],
                statuses=dict(Counter(run.status for run in group.runs)),
                outcomes=dict(Counter(run.outcome for run in group.runs if run.outcome is not None)),
                stats={column: describe([f[column] for f in figures]) for column in STAT_COLUMNS},
                left_out=len(group.runs) - len(counted),
            )
        )
    return rows


def format_stat(stat: Stat, spec: str, std_spec: str = ".2g") -> str:
    """'0.0123 ± 0.0004', with ' (k/n)' when only k of the n runs have a value; '—' when none."""
    if stat.n == 0:
        return "—"
    text = format(stat.mean, spec) + (f" ± {format(stat.std, std_spec)}" if stat.std is not None else "")
    return text + (f" ({stat.n}/{stat.total})" if stat.n < stat.total else "")


def format_steps(stat: Stat) -> str:
    """Steps to threshold over the runs that reached it, and how many never did."""
    never = stat.total - stat.n
    if stat.total == 0:  # no run of the group is counted
        return "—"
    if stat.n == 0:
        return f"never ({never}/{stat.total})"
    text = format(stat.mean, ".0f") + (f" ± {stat.std:.0f}" if stat.std is not None else "")
    return text + (f"; never {never}/{stat.total}" if never else "")


def format_statuses(statuses: dict) -> str:
    return ", ".join(f"{status} {count}" for status, count in sorted(statuses.items()))


def group_table(rows: list[GroupRow], threshold: float, include_unfinished: bool = False) -> str:
    header = [
        "group",
        "n",
        "status",
        "outcome",
        "final eval loss",
        "final eval acc",
        "best eval loss",
        f"steps to acc ≥ {threshold:g}",
        "wall time (s)",
    ]
    cells = []
    for row in rows:
        s = row.stats
        n = str(len(row.seeds)) + (f" ({row.left_out} left out)" if row.left_out else "")
        cells.append(
            [
                row.label,
                n,
                format_statuses(row.statuses),
                format_statuses(row.outcomes) or "—",
                format_stat(s["final_eval_loss"], ".4g"),
                format_stat(s["final_eval_accuracy"], ".3f", ".3f"),
                format_stat(s["best_eval_loss"], ".4g"),
                format_steps(s["steps_to_threshold"]),
                format_stat(s["wall_time"], ".1f", ".1f"),
            ]
        )
    notes = [
        "",
        "mean ± sample std over the runs of each group; (k/n): only k of its n runs have a value "
        "(a diverged run has no final figures); steps to acc: the first logged step with "
        f"{THRESHOLD_METRIC} ≥ {threshold:g}, over the runs that reached it.",
    ]
    left_out = sum(row.left_out for row in rows)
    if left_out:
        notes.append(
            f"Left out of the statistics: {left_out} run{'s' * (left_out != 1)} that did not finish "
            "(drawn as far as they got; --include-unfinished counts them)."
        )
    elif include_unfinished and any(status not in runs.FINISHED for row in rows for status in row.statuses):
        notes.append(
            "Runs that did not finish are counted (--include-unfinished): their figures are where they "
            "stopped, not final."
        )
    return "\n".join([markdown_table(header, cells)] + notes) + "\n"


def csv_table(rows: list[GroupRow]) -> str:
    """One line per group; a setting its task does not read is left empty."""
    keys = list(dict.fromkeys(k for row in rows for k in row.settings))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "group",
            *keys,
            "n_runs",
            "n_left_out",
            "seeds",
            "status",
            "outcome",
            *[f"{c}_{part}" for c in STAT_COLUMNS for part in ("mean", "std", "n")],
        ]
    )
    for row in rows:
        stats = [value for c in STAT_COLUMNS for value in (row.stats[c].mean, row.stats[c].std, row.stats[c].n)]
        writer.writerow(
            [
                row.label,
                *[format_value(row.settings[k]) if k in row.settings else "" for k in keys],
                len(row.seeds),
                row.left_out,
                " ".join(format_value(s) for s in row.seeds),
                "; ".join(f"{k}: {v}" for k, v in sorted(row.statuses.items())),
                "; ".join(f"{k}: {v}" for k, v in sorted(row.outcomes.items())),
                *["" if v is None else v for v in stats],
            ]
        )
    return buffer.getvalue()


# ---------------------------------------------------------------------------
# compare: the whole command
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    out_dir: Path
    written: list  # list[Path]
    groups: list  # list[Group]
    rows: list  # list[GroupRow]
    skipped: list  # list[Skipped]: the PATHs holding no run, then the runs not plotted
    table: str  # the Markdown table (table.md also lists the runs not plotted)
    warnings: list = dataclasses.field(default_factory=list)  # one line each: duplicate seeds (duplicate_seeds)


def check_options(
    metrics, x: str, smoothing: float, threshold: float, yscale: str, group_by=None, facet=None, xlim=None
) -> None:
    if not metrics:
        raise ArgumentError("metrics", "got none; expected at least one logged metric, e.g. eval_loss")
    if x not in X_AXES:
        raise ArgumentError("x", f"got {x!r}; expected one of {', '.join(X_AXES)}")
    if not (isinstance(smoothing, (int, float)) and 0 <= smoothing < 1):
        raise ArgumentError("smoothing", f"got {smoothing!r}; expected a number in [0, 1) (0 = no smoothing)")
    if not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise ArgumentError("threshold", f"got {threshold!r}; expected an accuracy in (0, 1], e.g. 0.99")
    if yscale not in YSCALES:
        raise ArgumentError("yscale", f"got {yscale!r}; expected one of {', '.join(YSCALES)}")
    for argument, keys in (("group_by", group_by or []), ("facet", [facet] if facet else [])):
        for key in keys:
            if key not in all_keys():
                raise ArgumentError(
                    argument,
                    f"got {key!r}; expected a dotted config key, e.g. model.scale" + did_you_mean(nearest_key(key)),
                )
    if xlim is not None and not (len(xlim) == 2 and all(math.isfinite(v) for v in xlim) and xlim[0] < xlim[1]):
        raise ArgumentError("xlim", f"got {xlim!r}; expected LOW,HIGH with LOW < HIGH, e.g. 0,500")


def check_metrics(metrics, logged: set[str]) -> None:
    """Every metric is logged; else one line with the nearest names, not all of them."""
    for metric in metrics:
        if metric not in logged:
            close = closest(metric, sorted(logged), n=5)
            shown = close[1:] or [k for k in sorted(logged) if "/" not in k][:6]  # the overall ones, not per parameter
            raise ArgumentError(
                "metrics",
                f"got {metric!r}{did_you_mean(*close)}; "
                + f"expected a logged metric, e.g. {', '.join(shown)} ({len(logged)} are logged: "
                "the keys of a run's metrics.jsonl)",
            )


RUNS_FILE = "runs.json"  # in a comparison's directory: the run directories it compared


def run_list(run_dirs: list[Path]) -> list[str]:
    return sorted(os.path.abspath(run_dir) for run_dir in run_dirs)


def compared_runs(out_dir: Path) -> list[str] | None:
    """The runs an earlier comparison in out_dir compared (None: no comparison
    there; [] if it holds files but no runs.json, written before it was kept)."""
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return None
    try:
        found = json.loads((out_dir / RUNS_FILE).read_text())
        return found if isinstance(found, list) else []
    except (OSError, ValueError):
        return []


def default_out_dir(run_dirs: list[Path]) -> Path:
    """Created: <parent>/compare if every run lies directly in one parent directory
    (and <parent>/compare is empty or a comparison of these same runs: an earlier
    comparison of other runs is never replaced), else a new compare-<time> in the
    runs' deepest common directory (module docstring). Absolute; never depends
    on the working directory."""
    parents = {Path(os.path.abspath(run_dir)).parent for run_dir in run_dirs}
    common = Path(os.path.commonpath(parents))
    try:
        if len(parents) == 1 and compared_runs(common / "compare") in (None, run_list(run_dirs)):
            (common / "compare").mkdir(exist_ok=True)
            return common / "compare"
        return runs.create_run_dir(common, f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    except OSError as err:
        raise runs.RunError(
            f"{common / 'compare'}: cannot create the output directory: {err.strerror}; choose one with --out DIR"
        ) from None
    except runs.RunError as err:
        raise runs.RunError(f"{err}; choose an output directory with --out DIR") from None


def compare(
    paths,
    metrics=DEFAULT_METRICS,
    x: str = "step",
    smoothing: float = 0.0,
    threshold: float = THRESHOLD,
    yscale: str = "auto",
    out: Path | None = None,
    *,
    where=(),
    group_by: list[str] | None = None,
    facet: str | None = None,
    xlim: tuple[float, float] | None = None,
    include_unfinished: bool = False,
    all_y: bool = False,
) -> Comparison:
    """Read the runs at PATHs (those matching every --where), group them and
    write compare.png, compare.svg, table.md and table.csv (module docstring).
    all_y: each panel's y range holds every finite value drawn, not just their bulk."""
    metrics = list(dict.fromkeys(metrics))
    check_options(metrics, x, smoothing, threshold, yscale, group_by, facet, xlim)
    conditions = parse_where(where)
    run_dirs, not_runs = find_run_dirs(paths)
    loaded, skipped = load_runs(run_dirs)
    if conditions:
        kept = [run for run in loaded if matches(run, conditions)]
        if not kept:
            raise ArgumentError(
                "where",
                "no run matches; among the runs, "
                + "; ".join(f"{key} is {_values_among(loaded, key)}" for key, _ in conditions),
                " ".join(where),
            )
        loaded = kept
    plotted = []
    for run in loaded:
        if run.records:
            plotted.append(run)
        else:
            skipped.append(Skipped(run.path, f"no metrics yet (status {run.status})"))
    if not plotted:
        raise runs.RunError(
            f"{', '.join(map(str, paths))}: nothing to compare: " + "; ".join(f"{s.path}: {s.reason}" for s in skipped)
        )
    check_metrics(metrics, {key for run in plotted for record in run.records for key in record} - {"step"})
    groups = group_runs(plotted, group_by, facet)
    rows = group_rows(groups, threshold, include_unfinished)
    if out is None:
        out_dir = default_out_dir(run_dirs)
    else:
        out_dir = Path(out)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise runs.RunError(f"{out_dir}: cannot create the output directory: {err.strerror}") from None
    fig = draw_comparison(
        groups,
        metrics,
        x,
        smoothing,
        yscale,
        shared_references(plotted),
        threshold,
        comparison_title(run_dirs, plotted, groups, conditions, group_by, facet),
        xlim,
        facet,
        robust=not all_y,
    )
    table = group_table(rows, threshold, include_unfinished)
    skipped_notes = "".join(f"\nskipped {s.path}: {s.reason}" for s in skipped) + ("\n" if skipped else "")
    written = [figures.save_figure(fig, out_dir / name, tight=False) for name in ("compare.png", "compare.svg")]
    runs.write_atomic(out_dir / RUNS_FILE, (json.dumps(run_list(run_dirs), indent=1) + "\n").encode())
    for name, text in (("table.md", table + skipped_notes), ("table.csv", csv_table(rows))):
        runs.write_atomic(out_dir / name, text.encode())
        written.append(out_dir / name)
    notes = duplicate_seeds(groups)
    earlier = out_dir.parent / "compare"
    if out is None and out_dir != earlier and compared_runs(earlier) is not None:
        notes.append(f"{earlier} holds a comparison of other runs and is kept; this one is in {out_dir}")
    return Comparison(out_dir, written, groups, rows, not_runs + skipped, table, notes)


def _values_among(loaded: list[Run], key: str) -> str:
    """'16, 64' : the values a key has among the runs (those whose task reads it)."""
    values = sorted(
        {
            format_value(run.settings[key])
            for run in loaded
            if key in run.settings and key not in unused_task_keys(run.settings)
        },
        key=natural_key,
    )
    return ", ".join(values) or "read by none of them"


def comparison_title(run_dirs: list[Path], plotted: list[Run], groups: list[Group], conditions, group_by, facet) -> str:
    """What the figure shows: which runs, how they are grouped and pooled, what the line and band are."""
    common = Path(os.path.commonpath([p.absolute() for p in run_dirs]))
    names = short_names(
        [*(group_by or []), *([facet] if facet else []), *(k for k, _ in conditions)],
        among=[k for run in plotted for k in run.settings],
    )
    parts = [f"{common.name or 'runs'}: {len(plotted)} runs in {len(groups)} groups"]
    if conditions:
        parts.append("where " + ", ".join(f"{names[k]}={format_value(plain_value(v))}" for k, v in conditions))
    if group_by:
        parts.append(f"grouped by {', '.join(names[k] for k in group_by)} only: seeds and every other setting pooled")
    if facet:
        parts.append(f"a row per {names[facet]}")
    return "; ".join(parts) + "; line: mean over a group's runs, band: ± std"
