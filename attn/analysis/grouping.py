"""Runs read from their directories and grouped: the seeds of one setting, each group labelled by what differs.

    run_dirs, not_runs = find_run_dirs(["runs/sqrt_dk"])
    loaded, skipped = load_runs(run_dirs)
    groups = group_runs(loaded)      # Group(label='scale=none, d_k=256', settings, runs), ...

Everything is read from run directories (config.yaml, metrics.jsonl,
summary.json), never from live objects, so finished, running, diverged and
interrupted runs compare alike; `attn compare`, `attn runs` and the board
read runs through here.

Which runs. Each PATH is a run directory (it holds config.yaml), a directory
holding run directories at any depth (an experiment), or a glob of either.
Hidden directories and symbolic links below a PATH are not walked. A plain
file, or a directory with no run below it, among the PATHs or a glob's
matches (an experiment's report.md, *.png, compare/) is skipped and listed
as skipped; finding no run at all is an error.

Which runs, further: `--where KEY=VALUE` (repeatable) keeps the runs whose
setting KEY has that value, typed as an override's (`--where optim.lr=1e-1`
matches 0.1); a run that does not read KEY (its task, score mode or optimiser does not) has no value for it.

Groups. Runs whose configs agree on every key except `seed` and the
bookkeeping keys (the schema's neutral fields: they change no logged number)
are one group: the seeds of one setting. With `--group-by KEY ...` runs are grouped
by those keys alone: seeds and every other setting are pooled (the title
says so). With `--facet KEY` each value of KEY gets its own row of panels
(a group never spans two), and KEY leaves the labels. Two runs of one group
with the same settings and seed (a run made twice) are named in a warning:
both are averaged, as runs of their own. Every config carries every task field, so
the fields a run's task never reads (unused_task_keys: retrieval ignores
copy's `length`) are no setting of that run: they neither split groups nor
appear in labels. A group's label names the keys whose values differ
between groups, each by its shortest unambiguous dotted suffix
(`model.scale` -> `scale=none, d_k=256`).
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn import outcomes
from attn.config.loading import field_value, flatten_config
from attn.config.schema import neutral_keys, replicate_keys, unread_keys
from attn.config.yamlio import ArgumentError, ConfigError, parse_yaml, show_value
from attn.store import locks, runs
from attn.text import format_value

THRESHOLD_METRIC = "eval_accuracy"
FALLBACK_LABEL_KEYS = ("task.name", "model.scale", "model.d_k")  # a label when no key differs between groups
NOT_A_RUN = "not a run or experiment directory"


# ---------------------------------------------------------------------------
# Finding and reading runs
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One run directory, as read from disk."""

    path: Path
    settings: dict  # the flattened config: dotted key -> value
    records: list  # metrics.jsonl (a torn last line dropped); its last record alone where load_run was asked for it
    summary: dict  # summary.json; {} before the first one is written
    status: str  # locks.effective_status: `stale` for a `running` run whose process is gone
    config_yaml: dict = field(default_factory=dict)  # config.yaml as read, its `provenance` included

    @property
    def provenance(self) -> dict:
        """Where and how the run was made (config.yaml's `provenance`)."""
        return self.config_yaml.get("provenance") or {}

    @property
    def said_outcome(self) -> str | None:
        """summary.json's outcome class, if it is one and agrees with the run's status (a diverged run
        is `diverged`, no other is); None before the run ended or where the summary says none."""
        said = self.summary.get("outcome")
        if self.status not in outcomes.ENDED or said not in outcomes.OUTCOMES:
            return None
        return said if (said == outcomes.DIVERGED) == (self.status == "diverged") else None

    @property
    def outcome(self) -> str | None:
        """Its outcome class (attn.outcomes): said_outcome, or from its records for a run that ended
        before runs named theirs; None while it has not ended."""
        if self.status not in outcomes.ENDED:
            return None
        if self.said_outcome is not None:
            return self.said_outcome
        try:
            ended = outcomes.of_run(self.records, {**self.summary, "status": self.status})
        except (ValueError, KeyError, TypeError):  # records a damaged file left out of order or without steps
            return None
        return None if ended is None else ended.outcome


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


NUMBER_IN_TEXT = re.compile(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def natural_key(text: str) -> list:
    """Sort key that reads the numbers in a text as numbers: 'dk16' before
    'dk256', 'lr0.01' before 'lr0.03' before 'lr0.1', 'lr1e-3' before 'lr0.01'."""
    parts = NUMBER_IN_TEXT.split(str(text))  # text, number, text, number, ..., text
    return [float(part) if i % 2 else part for i, part in enumerate(parts)]


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
            raise runs.RunError(
                f"{text}: no such file or directory; expected a run directory (holding config.yaml), "
                "a directory of runs, or a glob of them"
            )
    return expanded


def find_run_dirs(paths) -> tuple[list[Path], list[Skipped]]:
    """(every run directory at or below the PATHs, each once, in natural order;
    the PATHs or glob matches holding no run: plain files such as an
    experiment's report.md, and directories such as its compare/).
    RunError when no run is found at all."""
    found, seen, not_runs = [], set(), []
    for path in expand_paths(paths):
        below = walk_runs(path)
        if not below:
            not_runs.append(Skipped(path, NOT_A_RUN))
        for run_dir in below:
            if run_dir.resolve() not in seen:
                seen.add(run_dir.resolve())
                found.append(run_dir)
    if not found:
        shown = [str(p) for p in paths]
        listed = [str(s.path) for s in not_runs]
        raise runs.RunError(
            f"{', '.join(shown)}: no run directories found (a run directory holds config.yaml)"
            + (f"; {NOT_A_RUN}: {', '.join(listed)}" if listed != shown else "")
        )
    return found, not_runs


def walk_runs(path: Path) -> list[Path]:
    if (path / "config.yaml").is_file():
        return [path]
    if not path.is_dir():
        return []
    try:
        children = sorted(
            (c for c in path.iterdir() if c.is_dir() and not c.is_symlink() and not c.name.startswith(".")),
            key=lambda c: natural_key(c.name),
        )
    except OSError as err:
        raise runs.RunError(f"{path}: cannot list: {err.strerror}") from None
    return [run_dir for child in children for run_dir in walk_runs(child)]


def load_run(run_dir: Path, last_record_only: bool = False) -> Run:
    """Read one run directory, every file checked by its runs reader (type,
    shape, size); RunError naming the file if one is damaged. With
    last_record_only, its records are its last one alone (every line is
    checked as it streams past, none kept: a listing's memory is a line's)."""
    run_dir = Path(run_dir)
    config_yaml = runs.read_run_config(run_dir)
    settings = flatten_config({k: v for k, v in config_yaml.items() if k != "provenance"})
    if last_record_only:
        last = runs.last_metrics_record(run_dir)
        records = [] if last is None else [last]
    else:
        records = runs.read_metrics(run_dir)
    summary = runs.read_summary(run_dir)
    return Run(run_dir, settings, records, summary or {}, locks.effective_status(summary, run_dir=run_dir), config_yaml)


def load_runs(run_dirs, last_record_only: bool = False) -> tuple[list[Run], list[Skipped]]:
    """(runs read, runs that could not be read with the reason); last_record_only as load_run's."""
    loaded, skipped = [], []
    for run_dir in run_dirs:
        try:
            loaded.append(load_run(run_dir, last_record_only))
        except runs.RunError as err:
            reason = str(err).removeprefix(f"{run_dir}/")
            skipped.append(Skipped(Path(run_dir), " ".join(reason.split())))
    return loaded, skipped


# ---------------------------------------------------------------------------
# Groups and labels
# ---------------------------------------------------------------------------
def unused_task_keys(settings: dict) -> set[str]:
    """The keys of a flattened config that its task, score mode or optimiser
    never reads: the other task's fields, copy's shift outside mode shift, other
    score modes' fields, Adam's betas under SGD (attn.config.schema.unread_keys)."""
    return unread_keys(settings)


@dataclass(frozen=True)
class Group:
    """The runs of one setting: configs equal except for the seed (and
    bookkeeping); or, grouped by some keys, equal in those."""

    label: str  # what differs between groups, the facet key left out
    settings: dict  # the shared config (or the grouping keys), without seed, neutral keys and keys its task ignores
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
    return [
        k for k in keys if len({canonical(s[k]) if k in s else None for s, unused in readers if k not in unused}) > 1
    ]


def table_keys(loaded: list[Run]) -> list[str]:
    """The columns of a table of runs: the settings that differ between them,
    bookkeeping keys left out, seed last (`attn runs`, the board)."""
    neutral, replicate = neutral_keys(), replicate_keys()
    settings = [{k: v for k, v in run.settings.items() if k not in neutral} for run in loaded]
    return sorted(varying_keys(settings), key=lambda k: k in replicate)


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
    not_grouped = replicate_keys() + neutral_keys()
    for run in loaded:
        keys = (
            [k for k in run.settings if k not in not_grouped]
            if by is None
            else list(dict.fromkeys([*by, *([facet] if facet else [])]))
        )
        settings = used_settings(run.settings, keys)
        identity = tuple((k, canonical(v)) for k, v in sorted(settings.items()))
        members.setdefault(identity, (settings, []))[1].append(run)
    shared = [settings for settings, _ in members.values()]
    keys = [k for k in varying_keys(shared) if k != facet]
    if not keys:  # one group (in each facet): name it by what it is
        keys = [k for k in (by or FALLBACK_LABEL_KEYS) if k in shared[0] and k != facet]
    among = [k for run in loaded for k in run.settings]
    names = short_names(keys + ([facet] if facet else []), among=among)
    groups = [
        Group(
            label(settings, keys, names),
            settings,
            sorted(group, key=lambda r: (_sort_value(r.settings.get("seed")), natural_key(r.path))),
            label(settings, [facet], names) if facet else "",
        )
        for settings, group in members.values()
    ]
    return sorted(groups, key=lambda g: [_sort_value(g.settings.get(k)) for k in ([facet] if facet else []) + keys])


def duplicate_seeds(groups: list[Group]) -> list[str]:
    """One line per seed that a group holds twice with the same settings (a
    run made twice): 'group lr=0.1: seed 0 is there 2 times: runs/a, runs/a-2'."""
    lines, neutral = [], neutral_keys()
    for group in groups:
        made: dict[str, list[Run]] = {}
        for run in group.runs:
            settings = used_settings(run.settings, [k for k in run.settings if k not in neutral])
            made.setdefault(canonical(settings), []).append(run)
        for twins in (runs_ for runs_ in made.values() if len(runs_) > 1):
            lines.append(
                f"group {group.name or 'of every run'}: seed {format_value(twins[0].settings.get('seed'))} "
                f"is there {len(twins)} times with the same settings: {', '.join(str(r.path) for r in twins)} "
                "(each is averaged as a run of its own)"
            )
    return lines


def parse_where(texts) -> list[tuple[str, object]]:
    """KEY=VALUE texts (`attn compare --where`) -> (dotted key, value typed as the field takes it, as in an
    override)."""
    conditions = []
    for text in texts:
        key, equals, raw = text.partition("=")
        shown = show_value(text)
        if not equals or not key.strip():
            raise ArgumentError("where", "expected KEY=VALUE with a dotted config key, e.g. model.d_k=64", shown)
        try:
            value = parse_yaml(raw, shown) if raw.strip() else ""
            conditions.append((key.strip(), field_value(key.strip(), value, shown)))
        except ConfigError as err:  # its message starts with the source given: the condition
            raise ArgumentError("where", str(err).removeprefix(f"{shown}: "), shown) from None
    return conditions


def matches(run: Run, conditions: list[tuple[str, object]]) -> bool:
    """Whether the run has every (key, value) of the conditions; a key its task does not read it has not."""
    unread = unused_task_keys(run.settings)
    return all(
        key in run.settings and key not in unread and canonical(run.settings[key]) == canonical(plain_value(value))
        for key, value in conditions
    )


def plain_value(value):
    """A typed value as a run's settings hold it: a mapping (optim.lr_mult's FrozenMapping) as a dict."""
    return dict(value) if isinstance(value, Mapping) else value


# ---------------------------------------------------------------------------
# A run's figures
# ---------------------------------------------------------------------------
def steps_to_threshold(records: list[dict], threshold: float, metric: str = THRESHOLD_METRIC) -> int | None:
    """The first logged step at which metric >= threshold, or None."""
    steps, values = runs.series(records, metric)
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
    _, losses = runs.series(run.records, "eval_loss")
    return {
        "final_eval_loss": final_loss,
        "final_eval_accuracy": final_accuracy,
        "best_eval_loss": float(losses.min()) if len(losses) else None,
        "steps_to_threshold": steps_to_threshold(run.records, threshold),
        "wall_time": last.get("wall_time") if runs.is_finite_number(last.get("wall_time")) else None,
    }
