"""Compare runs: overlaid curves with seed bands, a summary table, and a listing.

Everything is read from run directories (config.yaml, metrics.jsonl,
summary.json), never from live objects, so finished, running, diverged and
interrupted runs compare alike.

    python -m attn compare runs/sqrt_dk/*     figures and table into runs/sqrt_dk/compare/
    python -m attn runs [PATH]                one line per run

Which runs. Each PATH is a run directory (it holds config.yaml), a directory
holding run directories at any depth (an experiment), or a glob of either.
Hidden directories and symbolic links below a PATH are not walked. A plain
file, or a directory with no run below it, among the PATHs or a glob's
matches (an experiment's report.md, *.png, compare/) is skipped and listed
as skipped; finding no run at all is an error.

Which runs, further: `--where KEY=VALUE` (repeatable) keeps the runs whose
setting KEY has that value, typed as an override's (`--where optim.lr=1e-1`
matches 0.1); a run whose task does not read KEY has no value for it.

Groups. Runs whose configs agree on every key except `seed` and the
bookkeeping keys (BOOKKEEPING_KEYS: they change no logged number) are one
group: the seeds of one setting. With `--group-by KEY ...` runs are grouped
by those keys alone: seeds and every other setting are pooled (the title
says so). With `--facet KEY` each value of KEY gets its own row of panels
(a group never spans two), and KEY leaves the labels. Two runs of one group
with the same settings and seed (a run made twice) are named in a warning:
both are averaged, as runs of their own. Every config carries every task field, so
the fields a run's task never reads (unused_task_keys: retrieval ignores
copy's `length`) are no setting of that run: they neither split groups nor
appear in labels. A group's label names the keys whose values differ
between groups, each by its shortest unambiguous dotted suffix
(`model.scale` -> `scale=none, d_k=256`); the n beside it in the legend is
the number of runs averaged at its last step drawn (of the first panel's
metric; within --xlim), not how many runs it has.

Statistics. The table's figures (final and best eval loss, steps to the
threshold, wall time) are over the runs of a group that finished
(completed or diverged, runs.FINISHED): a run still going, stale, interrupted or
failed is drawn as far as it got, but its last figures are not final; the
table says how many runs each group left out, and --include-unfinished
counts them too.

Axes. --xlim LOW,HIGH fixes the x range of every panel (runs of very
different lengths on one axis), and the y range follows what is drawn in it.
A long legend goes below the panels, in as many columns as fit the figure's
width, its labels wrapped to fit, and the figure grows to hold it.

Output. Figures and tables go to --out if given; else, when every run lies
directly in one directory (an experiment, or a runs_dir of hand-trained
runs), to <that directory>/compare, overwritten by the next comparison there;
else to a new compare-<time> directory in the runs' deepest common
directory. Only the runs' paths decide, never the working directory.

Bands. A group's curve is computed on the union of the steps its runs
logged. At step s, with x_1..x_n the finite values of the runs that logged
s (a run that has not reached s, or whose value there is NaN, is not among
them):

    mean(s) = (1/n) Σ_i x_i
    std(s)  = sqrt( Σ_i (x_i - mean(s))^2 / (n - 1) )     for n >= 2, none for n = 1

so a seed that is still running narrows the band to the seeds that have
arrived, and a diverged seed leaves it at its first non-finite value (the
table counts it under status). The band drawn is mean ± std clipped to the
range of the runs' values at that step: it never claims a value no run had
(with two seeds it is their range; on a log axis mean - std may be <= 0).
With x = wall_time, each step is placed at the mean wall time of the runs
that logged it.

Smoothing (optional) is applied to each run before the band statistics:
the bias-corrected exponential moving average over the logged points,

    m_0 = 0,  m_t = β m_{t-1} + (1 - β) y_t,  ŷ_t = m_t / (1 - β^t)
              = Σ_{i<=t} β^(t-i) y_i / Σ_{i<=t} β^(t-i),

Adam's bias correction, as in TensorBoard's debiased smoothing: early points
are a weighted mean of what was seen so far, not pulled toward 0.
"""

from __future__ import annotations

import csv
import difflib
import glob
import io
import json
import math
import os
import re
import textwrap
import time
from collections import Counter
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attn import locks, plots, runs
from attn.config import TaskConfig, all_keys, field_value, flatten_config, nearest_key, unread_keys
from attn.yamlio import ConfigError, parse_yaml, show_value
from attn.jobs import RESULT_NEUTRAL_KEYS

DEFAULT_METRICS = ("eval_loss", "eval_accuracy")
X_AXES = {"step": "step", "wall_time": "wall time (s)"}
YSCALES = ("auto", "log", "linear")
THRESHOLD_METRIC = "eval_accuracy"
BOOKKEEPING_KEYS = RESULT_NEUTRAL_KEYS
NOT_GROUPED = ("seed",) + BOOKKEEPING_KEYS
FALLBACK_LABEL_KEYS = ("task.name", "model.scale", "model.d_k")  # a label when no key differs between groups
LIST_STATUSES = runs.STATUSES + ("stale", "unknown")
NOT_A_RUN = "not a run or experiment directory"
RUNS_ROOT = Path("runs")
LINESTYLES = ("-", "--", "-.", ":")
WIDE_RANGE = 1e3  # --yscale auto: a positive metric whose values span more than this factor gets a log axis


# ---------------------------------------------------------------------------
# Finding and reading runs
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One run directory, as read from disk."""

    path: Path
    settings: dict  # the flattened config: dotted key -> value
    records: list  # metrics.jsonl (a torn last line dropped)
    summary: dict  # summary.json; {} before the first one is written
    status: str  # locks.effective_status: `stale` for a `running` run whose process is gone


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


def natural_key(text: str) -> list:
    """Sort key that orders 'dk16' before 'dk256'."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]


def expand_paths(paths) -> list[Path]:
    """Each PATH as it is if it exists, else its glob's matches in natural order;
    RunError for a PATH that neither exists nor matches anything."""
    expanded = []
    for text in map(str, paths):
        if Path(text).exists():
            expanded.append(Path(text))
        elif any(c in text for c in "*?[") and (matches := glob.glob(text, recursive=True)):
            expanded += [Path(m) for m in sorted(matches, key=natural_key)]
        else:
            raise runs.RunError(f"{text}: no such file or directory; expected a run directory (holding config.yaml), "
                                "a directory of runs, or a glob of them")
    return expanded


def find_run_dirs(paths) -> tuple[list[Path], list[Skipped]]:
    """(every run directory at or below the PATHs, each once, in natural order;
    the PATHs or glob matches holding no run: plain files such as an
    experiment's report.md, and directories such as its compare/).
    RunError when no run is found at all."""
    found, seen, not_runs = [], set(), []
    for path in expand_paths(paths):
        below = _walk_runs(path)
        if not below:
            not_runs.append(Skipped(path, NOT_A_RUN))
        for run_dir in below:
            if run_dir.resolve() not in seen:
                seen.add(run_dir.resolve())
                found.append(run_dir)
    if not found:
        shown = [str(p) for p in paths]
        listed = [str(s.path) for s in not_runs]
        raise runs.RunError(f"{', '.join(shown)}: no run directories found (a run directory holds config.yaml)"
                            + (f"; {NOT_A_RUN}: {', '.join(listed)}" if listed != shown else ""))
    return found, not_runs


def _walk_runs(path: Path) -> list[Path]:
    if (path / "config.yaml").is_file():
        return [path]
    if not path.is_dir():
        return []
    try:
        children = sorted((c for c in path.iterdir() if c.is_dir() and not c.is_symlink() and not c.name.startswith(".")),
                          key=lambda c: natural_key(c.name))
    except OSError as err:
        raise runs.RunError(f"{path}: cannot list: {err.strerror}") from None
    return [run_dir for child in children for run_dir in _walk_runs(child)]


def load_run(run_dir: Path) -> Run:
    """Read one run directory, every file checked by its runs reader (type,
    shape, size); RunError naming the file if one is damaged."""
    run_dir = Path(run_dir)
    settings = flatten_config(runs.read_config_dict(run_dir))
    records = runs.read_metrics(run_dir)
    summary = runs.read_summary(run_dir)
    return Run(run_dir, settings, records, summary or {}, locks.effective_status(summary, run_dir=run_dir))


def load_runs(run_dirs) -> tuple[list[Run], list[Skipped]]:
    """(runs read, runs that could not be read with the reason)."""
    loaded, skipped = [], []
    for run_dir in run_dirs:
        try:
            loaded.append(load_run(run_dir))
        except runs.RunError as err:
            reason = str(err).removeprefix(f"{run_dir}/")
            skipped.append(Skipped(Path(run_dir), " ".join(reason.split())))
    return loaded, skipped


# ---------------------------------------------------------------------------
# Groups and labels
# ---------------------------------------------------------------------------
# The task fields only one task (or one task.mode) reads, as TaskConfig declares them;
# the others (name, eval_size) are read by every task.
TASK_ONLY_KEYS = {f"task.{f.name}": f.metadata["task"] for f in fields(TaskConfig)
                  if f.metadata["task"]}  # dotted key -> the task reading it
MODE_ONLY_KEYS = {f"task.{f.name}": f.metadata["mode"] for f in fields(TaskConfig)
                  if f.metadata["mode"]}  # dotted key -> the task.mode reading it (copy's shift: mode shift only)


def unused_task_keys(settings: dict) -> set[str]:
    """The keys of a flattened config that its task (or score mode) never reads:
    the other task's fields, copy's shift outside mode shift, other score
    modes' fields (attn.config.unread_keys)."""
    return unread_keys(settings)


@dataclass(frozen=True)
class Group:
    """The runs of one setting: configs equal except for the seed (and
    bookkeeping); or, grouped by some keys, equal in those."""

    label: str  # what differs between groups, the facet key left out
    settings: dict  # the shared config (or the grouping keys), without NOT_GROUPED keys and keys its task ignores
    runs: list  # list[Run], by seed
    facet: str = ""  # 'd_k=64' with --facet model.d_k

    @property
    def name(self) -> str:
        """The label with the facet: what tells the group apart in a table."""
        return ", ".join(part for part in (self.label, self.facet) if part)


def canonical(value) -> str:
    """A value as hashable text, equal for equal values whatever the order of a
    mapping's items (a setting may be a mapping, e.g. optim.lr_mult)."""
    return json.dumps(value, sort_keys=True, default=str)


def format_value(value) -> str:
    """A config value as YAML would write it, short: null, true, 0.001, {W_q: 0.1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _sort_value(value) -> tuple:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, value, "")
    return (0 if value is None else 2, 0, format_value(value))


def varying_keys(settings_list: list[dict]) -> list[str]:
    """Dotted keys whose values are not all the same, in config order. A missing
    key counts as a value, but a config whose task does not read a key
    (unused_task_keys) has no say about it: retrieval's `length` is not compared."""
    keys = list(dict.fromkeys(k for settings in settings_list for k in settings))
    readers = [(settings, unused_task_keys(settings)) for settings in settings_list]
    return [k for k in keys
            if len({canonical(s[k]) if k in s else None for s, unused in readers if k not in unused}) > 1]


def short_names(keys: list[str], among=()) -> dict[str, str]:
    """Each dotted key by its shortest suffix that no other key (of keys and among)
    ends with: model.d_k -> d_k, but task.name -> task.name beside the top-level name."""
    others = set(keys) | set(among)
    names = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(other != key and (other == suffix or other.endswith("." + suffix)) for other in others):
                break
        names[key] = suffix
    return names


def used_settings(settings: dict, keys: list[str]) -> dict:
    """The keys (of those given) that the config's task reads -> their values."""
    unused = unused_task_keys(settings)
    return {k: settings.get(k) for k in keys if k not in unused}


def label(settings: dict, keys: list[str], names: dict[str, str]) -> str:
    """'scale=none, d_k=256' for the given keys that the config's task reads."""
    return ", ".join(f"{names[k]}={format_value(v)}" for k, v in used_settings(settings, keys).items())


def group_runs(loaded: list[Run], by: list[str] | None = None, facet: str | None = None) -> list[Group]:
    """Groups of runs equal in config except seed (or, `by` given, equal in
    those keys), a group never spanning two values of `facet`; labelled by
    what differs (the facet key aside), ordered by facet, then those values."""
    if not loaded:
        return []
    members: dict[tuple, tuple[dict, list[Run]]] = {}  # identity -> (the shared settings, the runs)
    for run in loaded:
        keys = [k for k in run.settings if k not in NOT_GROUPED] if by is None else \
            list(dict.fromkeys([*by, *([facet] if facet else [])]))
        settings = used_settings(run.settings, keys)
        identity = tuple((k, canonical(v)) for k, v in sorted(settings.items()))
        members.setdefault(identity, (settings, []))[1].append(run)
    shared = [settings for settings, _ in members.values()]
    keys = [k for k in varying_keys(shared) if k != facet]
    if not keys:  # one group (in each facet): name it by what it is
        keys = [k for k in (by or FALLBACK_LABEL_KEYS) if k in shared[0] and k != facet]
    among = [k for run in loaded for k in run.settings]
    names = short_names(keys + ([facet] if facet else []), among=among)
    groups = [Group(label(settings, keys, names), settings,
                    sorted(group, key=lambda r: (_sort_value(r.settings.get("seed")), natural_key(r.path))),
                    label(settings, [facet], names) if facet else "")
              for settings, group in members.values()]
    return sorted(groups, key=lambda g: [_sort_value(g.settings.get(k)) for k in ([facet] if facet else []) + keys])


def duplicate_seeds(groups: list[Group]) -> list[str]:
    """One line per seed that a group holds twice with the same settings (a
    run made twice): 'group lr=0.1: seed 0 is there 2 times: runs/a, runs/a-2'."""
    lines = []
    for group in groups:
        made: dict[str, list[Run]] = {}
        for run in group.runs:
            settings = used_settings(run.settings, [k for k in run.settings if k not in BOOKKEEPING_KEYS])
            made.setdefault(canonical(settings), []).append(run)
        for twins in (runs_ for runs_ in made.values() if len(runs_) > 1):
            lines.append(f"group {group.name or 'of every run'}: seed {format_value(twins[0].settings.get('seed'))} "
                         f"is there {len(twins)} times with the same settings: {', '.join(str(r.path) for r in twins)} "
                         "(each is averaged as a run of its own)")
    return lines


def parse_where(texts) -> list[tuple[str, object]]:
    """--where KEY=VALUE texts -> (dotted key, value typed as the field takes it, as in an override)."""
    conditions = []
    for text in texts:
        key, equals, raw = text.partition("=")
        where = f"--where {show_value(text)}"
        if not equals or not key.strip():
            raise ConfigError(f"{where}: expected KEY=VALUE with a dotted config key, e.g. --where model.d_k=64")
        value = parse_yaml(raw, where) if raw.strip() else ""
        conditions.append((key.strip(), field_value(key.strip(), value, where)))
    return conditions


def matches(run: Run, conditions: list[tuple[str, object]]) -> bool:
    """Whether the run has every (key, value) of the conditions; a key its task does not read it has not."""
    unread = unused_task_keys(run.settings)
    return all(key in run.settings and key not in unread and canonical(run.settings[key]) == canonical(_plain(value))
               for key, value in conditions)


def _plain(value):
    return dict(value) if isinstance(value, Mapping) else value


# ---------------------------------------------------------------------------
# Curves: smoothing and band statistics
# ---------------------------------------------------------------------------
def ema(values: np.ndarray, smoothing: float) -> np.ndarray:
    """Bias-corrected exponential moving average (module docstring); smoothing = β in [0, 1)."""
    smoothed = np.empty(len(values))
    moment = 0.0
    for t, y in enumerate(np.asarray(values, dtype=float), 1):
        moment = smoothing * moment + (1.0 - smoothing) * y
        smoothed[t - 1] = moment / (1.0 - smoothing**t)
    return smoothed


@dataclass(frozen=True)
class Band:
    """Per-step statistics of a group's runs (module docstring)."""

    steps: np.ndarray  # (S,) union of the steps logged
    mean: np.ndarray  # (S,)
    std: np.ndarray  # (S,) sample std; NaN where count < 2
    count: np.ndarray  # (S,) runs with a finite value at that step
    low: np.ndarray  # (S,) smallest value of a run at that step
    high: np.ndarray  # (S,) largest

    def take(self, index: np.ndarray) -> Band:
        return Band(*(getattr(self, f.name)[index] for f in fields(self)))

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """The drawn band: mean ± std, clipped to the range of the runs' values
        (no band claims a value no run had; on a log axis mean - std may be <= 0)."""
        return np.maximum(self.mean - self.std, self.low), np.minimum(self.mean + self.std, self.high)


def band_stats(curves: list[tuple[np.ndarray, np.ndarray]]) -> Band:
    """Mean and sample std over runs at each step of the union of their steps.

    curves: (steps, values) per run; non-finite values count as not logged,
    and a step no run has a finite value at is left out."""
    steps = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s, _ in curves])) if curves else np.array([], np.int64)
    table = np.full((len(curves), len(steps)), np.nan)  # (R, S)
    for row, (run_steps, values) in zip(table, curves):
        row[np.searchsorted(steps, run_steps)] = values
    present = np.isfinite(table)
    keep = present.any(axis=0)
    steps, table, present = steps[keep], table[:, keep], present[:, keep]
    count = present.sum(axis=0)  # (S,) >= 1
    mean = np.where(present, table, 0.0).sum(axis=0) / count
    squares = (np.where(present, table - mean, 0.0) ** 2).sum(axis=0)
    std = np.full(len(steps), np.nan)
    many = count >= 2
    std[many] = np.sqrt(squares[many] / (count[many] - 1))
    low = np.where(present, table, np.inf).min(axis=0)
    high = np.where(present, table, -np.inf).max(axis=0)
    return Band(steps, mean, std, count, low, high)


def run_curve(run: Run, metric: str, smoothing: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one run's metric, non-finite values dropped, then smoothed."""
    steps, values = plots.series(run.records, metric)
    return steps, ema(values, smoothing)


def _placed(steps: np.ndarray, members: list[Run], x: str) -> tuple[np.ndarray, np.ndarray]:
    """(x coordinates, index into steps) of the steps that have an x coordinate."""
    if x == "step":
        return steps.astype(float), np.arange(len(steps))
    clock = band_stats([plots.series(run.records, x) for run in members])
    _, at_steps, at_clock = np.intersect1d(steps, clock.steps, return_indices=True)
    return clock.mean[at_clock], at_steps


def group_curve(group: Group, metric: str, x: str = "step", smoothing: float = 0.0) -> tuple[np.ndarray, Band]:
    """(x coordinates, band) of a group's metric; x is the step or the mean wall time at each step."""
    band = band_stats([run_curve(run, metric, smoothing) for run in group.runs])
    xs, index = _placed(band.steps, group.runs, x)
    return xs, band.take(index)


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


def steps_to_threshold(records: list[dict], threshold: float, metric: str = THRESHOLD_METRIC) -> int | None:
    """The first logged step at which metric >= threshold, or None."""
    steps, values = plots.series(records, metric)
    reached = np.flatnonzero(values >= threshold)
    return int(steps[reached[0]]) if len(reached) else None


def final_figures(run: Run) -> tuple[float | None, float | None]:
    """(eval loss, eval accuracy) of the last record, only if that eval loss is
    finite: a diverged run has no final figures."""
    last = run.records[-1] if run.records else {}
    if not runs.is_finite_number(last.get("eval_loss")):
        return None, None
    accuracy = last.get("eval_accuracy")
    return float(last["eval_loss"]), float(accuracy) if runs.is_finite_number(accuracy) else None


def run_figures(run: Run, threshold: float) -> dict:
    """One run's table figures."""
    last = run.records[-1] if run.records else {}
    final_loss, final_accuracy = final_figures(run)
    _, losses = plots.series(run.records, "eval_loss")
    return {
        "final_eval_loss": final_loss,
        "final_eval_accuracy": final_accuracy,
        "best_eval_loss": float(losses.min()) if len(losses) else None,
        "steps_to_threshold": steps_to_threshold(run.records, threshold),
        "wall_time": last.get("wall_time") if runs.is_finite_number(last.get("wall_time")) else None,
    }


STAT_COLUMNS = ("final_eval_loss", "final_eval_accuracy", "best_eval_loss", "steps_to_threshold", "wall_time")


@dataclass(frozen=True)
class GroupRow:
    label: str
    settings: dict  # the keys that differ between groups and that its task reads -> this group's values
    seeds: list
    statuses: dict  # effective status -> number of runs
    stats: dict  # STAT_COLUMNS -> Stat, over the runs counted
    left_out: int = 0  # runs drawn but not counted: they did not finish (module docstring, Statistics)


def table_rows(groups: list[Group], threshold: float, include_unfinished: bool = False) -> list[GroupRow]:
    """One row per group; its statistics over the runs that finished (all of them with include_unfinished)."""
    keys = varying_keys([g.settings for g in groups])
    rows = []
    for group in groups:
        counted = [run for run in group.runs if include_unfinished or run.status in runs.FINISHED]
        figures = [run_figures(run, threshold) for run in counted]
        rows.append(GroupRow(
            label=group.name,
            settings=used_settings(group.settings, keys),
            seeds=[run.settings.get("seed") for run in group.runs],
            statuses=dict(Counter(run.status for run in group.runs)),
            stats={column: describe([f[column] for f in figures]) for column in STAT_COLUMNS},
            left_out=len(group.runs) - len(counted),
        ))
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


def markdown_table(rows: list[GroupRow], threshold: float, include_unfinished: bool = False) -> str:
    header = ["group", "n", "status", "final eval loss", "final eval acc", "best eval loss",
              f"steps to acc ≥ {threshold:g}", "wall time (s)"]
    cells = []
    for row in rows:
        s = row.stats
        n = str(len(row.seeds)) + (f" ({row.left_out} left out)" if row.left_out else "")
        cells.append([row.label, n, format_statuses(row.statuses),
                      format_stat(s["final_eval_loss"], ".4g"), format_stat(s["final_eval_accuracy"], ".3f", ".3f"),
                      format_stat(s["best_eval_loss"], ".4g"), format_steps(s["steps_to_threshold"]),
                      format_stat(s["wall_time"], ".1f", ".1f")])
    notes = ["", "mean ± sample std over the runs of each group; (k/n): only k of its n runs have a value "
             "(a diverged run has no final figures); steps to acc: the first logged step with "
             f"{THRESHOLD_METRIC} ≥ {threshold:g}, over the runs that reached it."]
    left_out = sum(row.left_out for row in rows)
    if left_out:
        notes.append(f"Left out of the statistics: {left_out} run{'s' * (left_out != 1)} that did not finish "
                     "(drawn as far as they got; --include-unfinished counts them).")
    elif include_unfinished and any(status not in runs.FINISHED for row in rows for status in row.statuses):
        notes.append("Runs that did not finish are counted (--include-unfinished): their figures are where they "
                     "stopped, not final.")
    return "\n".join([runs.markdown_table(header, cells)] + notes) + "\n"


def csv_table(rows: list[GroupRow]) -> str:
    """One line per group; a setting its task does not read is left empty."""
    keys = list(dict.fromkeys(k for row in rows for k in row.settings))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["group", *keys, "n_runs", "n_left_out", "seeds", "status",
                     *[f"{c}_{part}" for c in STAT_COLUMNS for part in ("mean", "std", "n")]])
    for row in rows:
        stats = [value for c in STAT_COLUMNS for value in (row.stats[c].mean, row.stats[c].std, row.stats[c].n)]
        writer.writerow([row.label, *[format_value(row.settings[k]) if k in row.settings else "" for k in keys],
                         len(row.seeds), row.left_out,
                         " ".join(format_value(s) for s in row.seeds),
                         "; ".join(f"{k}: {v}" for k, v in sorted(row.statuses.items())),
                         *["" if v is None else v for v in stats]])
    return buffer.getvalue()


# ---------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------
def shared_references(loaded: list[Run]) -> dict:
    """The reference losses (chance, no retrieval) if every run has the same ones, else {}."""
    found = {canonical(run.summary.get("references") or {}) for run in loaded}
    return json.loads(found.pop()) if len(found) == 1 else {}


def _limits(arrays: list, log: bool) -> tuple[float, float] | None:
    """y limits holding every finite (and, on a log axis, positive) value, with a margin."""
    values = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays]) if arrays else np.array([])
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    if not len(values):
        return None
    low, high = float(values.min()), float(values.max())
    if log:
        span = max(math.log10(high / low), 0.1)
        return low / 10 ** (0.05 * span), high * 10 ** (0.05 * span)
    span = high - low or max(abs(high), 1.0) * 0.1
    return low - 0.05 * span, high + 0.05 * span


LEGEND_FONT_POINTS = 8
CHAR_INCHES = 0.55 * LEGEND_FONT_POINTS / 72  # the width of a legend character, about
HANDLE_INCHES = 0.7  # a legend entry's line sample and padding
LINE_INCHES = 1.6 * LEGEND_FONT_POINTS / 72  # a legend line's height


def last_counts(groups: list[Group], metric: str, x: str = "step", smoothing: float = 0.0,
                xlim: tuple[float, float] | None = None) -> list[int]:
    """Per group, the number of runs averaged at its last point drawn (within xlim) of `metric`."""
    counts = []
    for group in groups:
        xs, band = group_curve(group, metric, x, smoothing)
        inside = np.flatnonzero((xs >= xlim[0]) & (xs <= xlim[1])) if xlim else np.arange(len(xs))
        counts.append(int(band.count[inside[-1]]) if len(inside) else 0)
    return counts


def legend_texts(groups: list[Group], counts: list[int]) -> dict[str, str]:
    """Each group label -> its legend text: 'scale=sqrt  (n=5)', with n the runs
    averaged at the last step ('n=3 of 5 at the last step' when fewer than it
    has; one count per facet row when they differ)."""
    pairs: dict[str, list[tuple[int, int]]] = {}
    for group, n in zip(groups, counts):
        pairs.setdefault(group.label, []).append((n, len(group.runs)))
    texts = {}
    for text, found in pairs.items():
        if len(set(found)) == 1:
            n, total = found[0]
            note = f"n={n}" if n == total else f"n={n} of {total} at the last step"
        else:
            note = "n=" + ", ".join(str(n) if n == total else f"{n} of {total}" for n, total in found) + \
                   " at the last step, by row"
        texts[text] = f"{text or 'all runs'}  ({note})"
    return texts


def legend_layout(texts: list[str], width: float) -> tuple[list[str], int, int]:
    """(the texts wrapped to fit the figure's width, columns, lines of text):
    as many columns as the widest entry allows."""
    chars = max(10, int((width - HANDLE_INCHES) / CHAR_INCHES))
    wrapped = [textwrap.fill(text, chars) for text in texts]
    widest = max(max(len(line) for line in text.split("\n")) for text in wrapped) * CHAR_INCHES + HANDLE_INCHES
    columns = max(1, min(len(wrapped), int(width // widest)))
    rows = [wrapped[i:i + columns] for i in range(0, len(wrapped), columns)]
    return wrapped, columns, sum(max(text.count("\n") + 1 for text in row) for row in rows)


def log_scale(metric: str, bands: list[Band], yscale: str = "auto") -> bool:
    """yscale auto: log for loss metrics, and for positive values spanning more than WIDE_RANGE."""
    if yscale != "auto":
        return yscale == "log"
    values = np.concatenate([np.concatenate([b.low, b.high]) for b in bands]) if bands else np.array([])
    return "loss" in metric or (len(values) > 0 and values.min() > 0 and values.max() > WIDE_RANGE * values.min())


def group_styles(groups: list[Group], ignore=()) -> list[dict]:
    """Colour and line style per group (the keys in `ignore` aside: a facet's
    key). With two or more differing keys, the one with fewest values (at
    most len(LINESTYLES)) sets the line style and the others the colour, so
    `d_k` x `scale` reads as colour = d_k, dash = scale."""
    keys = [k for k in varying_keys([g.settings for g in groups]) if k not in ignore]
    seen = {k: list(dict.fromkeys(canonical(g.settings.get(k)) for g in groups)) for k in keys}
    few = [k for k in keys if len(seen[k]) <= len(LINESTYLES)]
    dash_key = min(few, key=lambda k: len(seen[k])) if len(keys) >= 2 and few else None
    colour_of = [tuple(canonical(g.settings.get(k)) for k in keys if k != dash_key) for g in groups]
    colours = list(dict.fromkeys(colour_of))
    styles = []
    for group, colour in zip(groups, colour_of):
        index = colours.index(colour)
        dash = seen[dash_key].index(canonical(group.settings.get(dash_key))) if dash_key else index // 10
        styles.append(dict(color=f"C{index % 10}", linestyle=LINESTYLES[dash % len(LINESTYLES)]))
    return styles


def draw_comparison(groups: list[Group], metrics=DEFAULT_METRICS, x: str = "step", smoothing: float = 0.0,
                    yscale: str = "auto", references: dict | None = None, threshold: float | None = None,
                    title: str = "", xlim: tuple[float, float] | None = None, facet: str | None = None) -> Figure:
    """One panel per metric, a row of them per facet value (groups' `facet`):
    each group's mean with a ± std band (single runs as lines); a diverged
    run's last finite value marked ×; references on loss panels. One legend
    below the panels (module docstring: Axes), the figure as tall as it needs."""
    rows = list(dict.fromkeys(g.facet for g in groups)) or [""]
    width = 5.0 * len(metrics) + 0.6
    fig = Figure(figsize=(width, 4.4 * len(rows)), layout="constrained")
    styles = group_styles(groups, ignore=(facet,))
    texts = legend_texts(groups, last_counts(groups, metrics[0], x, smoothing, xlim))
    for row, value in enumerate(rows):
        shown = [k for k, g in enumerate(groups) if g.facet == value]
        for column, metric in enumerate(metrics):
            ax = fig.add_subplot(len(rows), len(metrics), row * len(metrics) + column + 1)
            _draw_panel(ax, [groups[k] for k in shown], [styles[k] for k in shown], [texts[groups[k].label] for k in shown],
                        metric, x, smoothing, yscale, references if "loss" in metric else None,
                        threshold if metric == THRESHOLD_METRIC else None, xlim, value)
    handles = {}
    for ax in fig.axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    group_texts = set(texts.values())
    order = sorted(handles, key=lambda text: text not in group_texts)
    wrapped, columns, lines = legend_layout(order, width)
    fig.legend([handles[text] for text in order], wrapped, loc="outside lower center", ncol=columns,
               fontsize=LEGEND_FONT_POINTS)
    fig.set_size_inches(width, 4.4 * len(rows) + lines * LINE_INCHES + 0.5)
    if title:
        fig.suptitle(textwrap.fill(title, int(width / (CHAR_INCHES * 10 / LEGEND_FONT_POINTS))), fontsize=10)
    return fig


def _draw_panel(ax, groups: list[Group], styles: list[dict], texts: list[str], metric: str, x: str, smoothing: float,
                yscale: str, references: dict | None, threshold: float | None, xlim: tuple[float, float] | None,
                facet: str) -> None:
    curves = [group_curve(group, metric, x, smoothing) for group in groups]
    log = log_scale(metric, [band for _, band in curves], yscale)
    if log:
        ax.set_yscale("log", nonpositive="clip")
    extents = [[0.0, 1.0]] if "accuracy" in metric and not log else []
    alpha = 0.18 if len(groups) <= 4 else 0.1
    for group, style, text, (xs, band) in zip(groups, styles, texts, curves):
        ax.plot(xs, band.mean, linewidth=1.5, label=text, **style)
        spread = np.isfinite(band.std)
        drawn = (xs >= xlim[0]) & (xs <= xlim[1]) if xlim else np.ones(len(xs), dtype=bool)  # what sets the y range
        extents.append(band.mean[drawn])
        if spread.any():
            lower, upper = band.edges()
            extents += [lower[spread & drawn], upper[spread & drawn]]
            ax.fill_between(xs, lower, upper, where=spread, color=style["color"], alpha=alpha, linewidth=0)
        for run in (r for r in group.runs if r.status == "diverged"):
            steps, values = run_curve(run, metric, smoothing)
            run_xs, placed = _placed(steps, [run], x)
            if len(placed):
                ax.plot(run_xs[-1], values[placed[-1]], marker="x", markersize=7, linestyle="none",
                        color=style["color"], label="diverged run (last finite value)")
    if references:
        plots.draw_references(ax, references)
        extents.append([v for v in references.values() if v is not None])
    if threshold is not None:
        ax.axhline(threshold, color="0.3", linestyle="-.", linewidth=0.8, label=f"threshold {threshold:g}")
    limits = _limits(extents, log)
    if limits:
        ax.set_ylim(*limits)
    if xlim:
        ax.set_xlim(*xlim)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(metric)
    ax.set_title(metric + (f"  (EMA {smoothing:g}, bias-corrected)" if smoothing else "")
                 + (f"  —  {facet}" if facet else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.25)


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


def check_options(metrics, x: str, smoothing: float, threshold: float, yscale: str, group_by=None, facet=None,
                  xlim=None) -> None:
    if not metrics:
        raise ConfigError("--metric: got none; expected at least one logged metric, e.g. eval_loss")
    if x not in X_AXES:
        raise ConfigError(f"--x: got {x!r}; expected one of {', '.join(X_AXES)}")
    if not (isinstance(smoothing, (int, float)) and 0 <= smoothing < 1):
        raise ConfigError(f"--smooth: got {smoothing!r}; expected a number in [0, 1) (0 = no smoothing)")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ConfigError(f"--threshold: got {threshold!r}; expected a finite number, e.g. 0.99")
    if yscale not in YSCALES:
        raise ConfigError(f"--yscale: got {yscale!r}; expected one of {', '.join(YSCALES)}")
    for option, keys in (("--group-by", group_by or []), ("--facet", [facet] if facet else [])):
        for key in keys:
            if key not in all_keys():
                suggestion = nearest_key(key)
                raise ConfigError(f"{option}: got {key!r}; expected a dotted config key, e.g. model.scale"
                                  + (f"; did you mean `{suggestion}`?" if suggestion else ""))
    if xlim is not None and not (len(xlim) == 2 and all(math.isfinite(v) for v in xlim) and xlim[0] < xlim[1]):
        raise ConfigError(f"--xlim: got {xlim!r}; expected LOW,HIGH with LOW < HIGH, e.g. 0,500")


def check_metrics(metrics, logged: set[str]) -> None:
    """Every metric is logged; else one line with the nearest names, not all of them."""
    for metric in metrics:
        if metric not in logged:
            close = difflib.get_close_matches(metric, sorted(logged), n=5)
            shown = close[1:] or [k for k in sorted(logged) if "/" not in k][:6]  # the overall ones, not per parameter
            raise ConfigError(f"--metric: got {metric!r}; " + (f"did you mean `{close[0]}`? " if close else "")
                              + f"expected a logged metric, e.g. {', '.join(shown)} ({len(logged)} are logged: "
                              "the keys of a run's metrics.jsonl)")


def default_out_dir(run_dirs: list[Path]) -> Path:
    """Created: <parent>/compare if every run lies directly in one parent directory,
    else a new compare-<time> in the runs' deepest common directory (module docstring).
    Absolute; never depends on the working directory."""
    parents = {Path(os.path.abspath(run_dir)).parent for run_dir in run_dirs}
    common = Path(os.path.commonpath(parents))
    try:
        if len(parents) == 1:
            (common / "compare").mkdir(exist_ok=True)
            return common / "compare"
        return runs.create_run_dir(common, f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    except OSError as err:
        raise runs.RunError(f"{common / 'compare'}: cannot create the output directory: {err.strerror}; "
                            "choose one with --out DIR") from None
    except runs.RunError as err:
        raise runs.RunError(f"{err}; choose an output directory with --out DIR") from None


def compare(paths, metrics=DEFAULT_METRICS, x: str = "step", smoothing: float = 0.0, threshold: float = 0.99,
            yscale: str = "auto", out: Path | None = None, *, where=(), group_by: list[str] | None = None,
            facet: str | None = None, xlim: tuple[float, float] | None = None,
            include_unfinished: bool = False) -> Comparison:
    """Read the runs at PATHs (those matching every --where), group them and
    write compare.png, compare.svg, table.md and table.csv (module docstring)."""
    metrics = list(dict.fromkeys(metrics))
    check_options(metrics, x, smoothing, threshold, yscale, group_by, facet, xlim)
    conditions = parse_where(where)
    run_dirs, not_runs = find_run_dirs(paths)
    loaded, skipped = load_runs(run_dirs)
    if conditions:
        kept = [run for run in loaded if matches(run, conditions)]
        if not kept:
            raise ConfigError(f"--where {' '.join(where)}: no run matches; among the runs, "
                              + "; ".join(f"{key} is {_values_among(loaded, key)}" for key, _ in conditions))
        loaded = kept
    plotted = []
    for run in loaded:
        if run.records:
            plotted.append(run)
        else:
            skipped.append(Skipped(run.path, f"no metrics yet (status {run.status})"))
    if not plotted:
        raise runs.RunError(f"{', '.join(map(str, paths))}: nothing to compare: "
                            + "; ".join(f"{s.path}: {s.reason}" for s in skipped))
    check_metrics(metrics, {key for run in plotted for record in run.records for key in record} - {"step"})
    groups = group_runs(plotted, group_by, facet)
    rows = table_rows(groups, threshold, include_unfinished)
    if out is None:
        out_dir = default_out_dir(run_dirs)
    else:
        out_dir = Path(out)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise runs.RunError(f"{out_dir}: cannot create the output directory: {err.strerror}") from None
    fig = draw_comparison(groups, metrics, x, smoothing, yscale, shared_references(plotted), threshold,
                          comparison_title(run_dirs, plotted, groups, conditions, group_by, facet), xlim, facet)
    table = markdown_table(rows, threshold, include_unfinished)
    skipped_notes = "".join(f"\nskipped {s.path}: {s.reason}" for s in skipped) + ("\n" if skipped else "")
    written = [plots.save_figure(fig, out_dir / name, tight=False) for name in ("compare.png", "compare.svg")]
    for name, text in (("table.md", table + skipped_notes), ("table.csv", csv_table(rows))):
        runs.write_atomic(out_dir / name, text.encode())
        written.append(out_dir / name)
    return Comparison(out_dir, written, groups, rows, not_runs + skipped, table, duplicate_seeds(groups))


def _values_among(loaded: list[Run], key: str) -> str:
    """'16, 64' : the values a key has among the runs (those whose task reads it)."""
    values = sorted({format_value(run.settings[key]) for run in loaded
                     if key in run.settings and key not in unused_task_keys(run.settings)}, key=natural_key)
    return ", ".join(values) or "read by none of them"


def comparison_title(run_dirs: list[Path], plotted: list[Run], groups: list[Group], conditions, group_by, facet) -> str:
    """What the figure shows: which runs, how they are grouped and pooled, what the line and band are."""
    common = Path(os.path.commonpath([p.absolute() for p in run_dirs]))
    names = short_names([*(group_by or []), *([facet] if facet else []), *(k for k, _ in conditions)],
                        among=[k for run in plotted for k in run.settings])
    parts = [f"{common.name or 'runs'}: {len(plotted)} runs in {len(groups)} groups"]
    if conditions:
        parts.append("where " + ", ".join(f"{names[k]}={format_value(_plain(v))}" for k, v in conditions))
    if group_by:
        parts.append(f"grouped by {', '.join(names[k] for k in group_by)} only: seeds and every other setting pooled")
    if facet:
        parts.append(f"a row per {names[facet]}")
    return "; ".join(parts) + "; line: mean over a group's runs, band: ± std"


# ---------------------------------------------------------------------------
# runs: the listing
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ListedRun:
    name: str  # path below the listed directory
    status: str
    task: str
    settings: dict  # Listing.keys that the run's task reads -> value
    final: tuple  # (eval loss, eval accuracy) last logged, (None, None) after a divergence
    age: float | None  # seconds since the last heartbeat (or since config.yaml was written)


@dataclass(frozen=True)
class Listing:
    keys: list  # dotted keys that differ between the runs listed
    names: dict  # dotted key -> short column name
    rows: list  # list[ListedRun]
    skipped: list  # list[Skipped]


def list_runs(path: Path = RUNS_ROOT, status: str | None = None, experiment: str | None = None,
              now: float | None = None) -> Listing:
    """The runs at or below path (or path/experiment), optionally only those with an effective status."""
    root = Path(path)
    if not root.is_dir():
        raise runs.RunError(f"{root}: no such directory; expected a directory of runs (default {RUNS_ROOT})")
    if status is not None and status not in LIST_STATUSES:
        raise ConfigError(f"--status: got {status!r}; expected one of {', '.join(LIST_STATUSES)}")
    base = root
    if experiment is not None:
        base = root / experiment
        if not base.is_dir() or (base / "config.yaml").exists():
            known = [c.name for c in sorted(root.iterdir(), key=lambda c: natural_key(c.name))
                     if c.is_dir() and not c.name.startswith(".") and not (c / "config.yaml").exists() and _walk_runs(c)]
            raise ConfigError(f"--experiment: got {experiment!r}; expected a directory of runs under {root}: "
                              f"{', '.join(known) or 'there are none'}")
    loaded, skipped = load_runs(_walk_runs(base))
    if status is not None:
        loaded = [run for run in loaded if run.status == status]
    settings = [{k: v for k, v in run.settings.items() if k not in BOOKKEEPING_KEYS} for run in loaded]
    keys = sorted((k for k in varying_keys(settings) if k != "task.name"), key=lambda k: k == "seed")  # seed last
    now = time.time() if now is None else now
    rows = [ListedRun(
        name=str(run.path.relative_to(root)) if run.path != root else run.path.name,
        status=run.status,
        task=str(run.settings.get("task.name", "?")),
        settings=used_settings(run.settings, keys),
        final=final_figures(run),
        age=now - (run.summary["updated_at"] if runs.is_finite_number(run.summary.get("updated_at"))
                   else (run.path / "config.yaml").stat().st_mtime),
    ) for run in loaded]
    return Listing(keys, short_names(keys, among=[k for run in loaded for k in run.settings]), rows, skipped)


def format_age(seconds: float | None) -> str:
    """Like ls: 42s, 12m, 5h, 3d."""
    if seconds is None:
        return "—"
    for unit, size, limit in (("s", 1, 90), ("m", 60, 90 * 60), ("h", 3600, 36 * 3600)):
        if seconds < limit:
            return f"{max(seconds, 0) / size:.0f}{unit}"
    return f"{seconds / 86400:.0f}d"
