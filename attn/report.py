"""An experiment's report, computed from its run directories only.

Which runs. A cell's run directory counts if it holds a summary and was made
with the cell's config (attn.sweep.config_change: equal but for fields that
change no logged number); a run made with another config, or one that
cannot be read, is left out and listed in the report with the reason. Of
the runs kept, the finished ones (completed or diverged) are the seeds that
every statistic, sentence and figure is over; interrupted, running, stale
and failed runs show in the status column and are named as not counted.

Per seed, by attn.compare's rules (one rule for both tools): the final eval
loss and accuracy are the last record's, and only when its eval loss is
finite (attn.compare.final_figures: a diverged seed has none, so `(k/n)`
says when only k of the n seeds have a value); the best eval loss and
accuracy are over the records with a finite eval loss; steps to 99% is the
first logged step with eval accuracy >= 99% (attn.compare.steps_to_threshold).

The fate of a seed. With L the plateau level of its task (the no-retrieval
loss for retrieval, chance for copy: summary.json `references`), a
completed seed that never reached 99%
    never left the plateau        best eval loss > 0.9 L
    learned, then lost it         best eval loss <= 0.9 L < final eval loss
    left the plateau, ended short best and final eval loss <= 0.9 L
and one that did reach 99% either kept it (final eval accuracy >= 99%) or
ended below 99%. A diverged seed is `diverged`, or `diverged after
reaching 99%`.

For each cell the table gives, as mean ± std over its finished seeds
(attn.compare.describe: sample std): final and best eval loss and accuracy;
steps to 99% over the seeds that got there, and how many never did; at
initialisation (the step-0 record): score std beside the theory value
sqrt(d_k) * s * qk_gain^2, attention entropy, saturated-row fraction,
||grad W_q|| and ||grad W_k||. It writes report.md (table + conclusion),
report.csv, and figures:
    loss_curves.png      eval loss of each arm per x value, mean ± std band over seeds
    steps_to_99.png      steps to 99% accuracy against x, per arm
    score_std_init.png   score std at init against x (log-log) with the theory line
    entropy.png          attention entropy over training, per arm and x value
    outcome_map.png      steps to 99% and final loss against score std at init: every cell

The experiment file's `report:` section names the grid key(s) on the x axis
(`x`), the key(s) whose values are the compared arms (`arm`), and
optionally a key to optimise away (`best_of`, see select_best: e.g. each
optimiser at its best rate). The conclusion is generated from the numbers;
nothing in it is typed in. Comparing arms, "N× the fastest arm" divides a
cell's mean steps to 99% by that of the fastest arm whose seeds all got
there; when some seeds of the cell never did, its mean counts them as the
budget (censored), which makes the ratio a lower bound, written "≥ N×".
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attn import runs
from attn.compare import (Run, band_stats, canonical, describe, final_figures, format_stat, format_steps,
                          format_value, load_runs, shared_references, short_names, steps_to_threshold)
from attn.config import ConfigError
from attn.layers import score_scale
from attn.plots import draw_references, save_figure, series
from attn.sweep import FINISHED, Experiment, config_change

THRESHOLD = 0.99
PLATEAU_FRACTION = 0.9  # a seed has left the plateau once its eval loss is below this fraction of the plateau level

KEPT = f"kept {THRESHOLD:.0%} to the end"
ENDED_BELOW = f"ended below {THRESHOLD:.0%}"
DIVERGED_AFTER = f"diverged after reaching {THRESHOLD:.0%}"
PLATEAU = "never left the plateau"
LOST = "learned, then lost it"
SHORT = f"left the plateau, ended short of {THRESHOLD:.0%}"
DIVERGED = "diverged"
UNCLASSIFIED = "no plateau level known"  # a summary without references (made by very old code)
REACHED_FATES = (KEPT, ENDED_BELOW, DIVERGED_AFTER)
MISSED_FATES = (PLATEAU, LOST, SHORT, DIVERGED, UNCLASSIFIED)


@dataclass(frozen=True)
class Seed:
    """One finished seed of a cell, its figures by attn.compare's rules."""

    seed: int
    run: Run
    final_loss: float | None  # None after a divergence
    final_accuracy: float | None
    best_loss: float | None  # over the records with a finite eval loss
    best_accuracy: float | None
    steps_to_99: int | None
    budget: int  # train.steps
    plateau: float | None  # the plateau level L of its task (nats)

    @property
    def fate(self) -> str:
        """What became of the seed (module docstring)."""
        reached = self.steps_to_99 is not None
        if self.run.status == "diverged":
            return DIVERGED_AFTER if reached else DIVERGED
        if reached:
            return KEPT if self.final_accuracy is not None and self.final_accuracy >= THRESHOLD else ENDED_BELOW
        if self.plateau is None or self.best_loss is None:
            return UNCLASSIFIED
        level = PLATEAU_FRACTION * self.plateau
        if self.best_loss > level:
            return PLATEAU
        return LOST if self.final_loss is None or self.final_loss > level else SHORT


def plateau_level(summary: dict) -> float | None:
    """The loss of a model that has not learned the task's mechanism: the
    no-retrieval loss where the task has one, else chance."""
    references = summary.get("references") or {}
    level = references.get("no_retrieval", references.get("chance"))
    return float(level) if runs.is_finite_number(level) else None


def seed_of(run: Run, seed: int) -> Seed:
    final_loss, final_accuracy = final_figures(run)
    scored = [r for r in run.records if runs.is_finite_number(r.get("eval_loss"))]
    accuracies = [r["eval_accuracy"] for r in scored if runs.is_finite_number(r.get("eval_accuracy"))]
    return Seed(seed, run, final_loss, final_accuracy,
                min((r["eval_loss"] for r in scored), default=None), max(accuracies, default=None),
                steps_to_threshold(run.records, THRESHOLD), int(run.summary.get("steps", 0)), plateau_level(run.summary))


@dataclass
class CellResult:
    """The runs of one grid cell, read back from their run directories."""

    settings: dict  # grid key -> value
    runs: list[Run]  # every run of the cell that was kept, finished or not
    seeds: list[Seed]  # the finished ones
    theory_score_std: float

    def statuses(self) -> list[str]:
        return [run.status for run in self.runs]

    def unfinished(self) -> Counter:
        return Counter(status for status in self.statuses() if status not in FINISHED)

    def at_init(self, key: str) -> np.ndarray:
        """Per finished seed, the step-0 record's value (nan where missing)."""
        return np.array([_number(s.run.records[0].get(key)) if s.run.records and s.run.records[0]["step"] == 0
                         else math.nan for s in self.seeds])

    def steps_to_99(self) -> list[int | None]:
        return [s.steps_to_99 for s in self.seeds]

    def final_losses(self) -> np.ndarray:
        return np.array([_number(s.final_loss) for s in self.seeds])

    def censored_mean_steps(self) -> float:
        """Mean steps to 99% over the finished seeds, a seed that never got
        there counted as its budget (inf without finished seeds)."""
        if not self.seeds:
            return math.inf
        return float(np.mean([s.budget if s.steps_to_99 is None else s.steps_to_99 for s in self.seeds]))

    @property
    def budget(self) -> int:
        return max((s.budget for s in self.seeds), default=0)


@dataclass(frozen=True)
class Excluded:
    """A run directory of the experiment that the report leaves out."""

    name: str
    reason: str


def _number(value) -> float:
    return float(value) if runs.is_finite_number(value) else math.nan


def mean_std(values) -> tuple[float, float]:
    """Mean and sample std over the finite values (attn.compare.describe);
    nan where there are too few values."""
    stat = describe(list(values))
    return (math.nan if stat.mean is None else stat.mean, math.nan if stat.std is None else stat.std)


def collect(experiment: Experiment) -> tuple[list[CellResult], list[Excluded]]:
    """Every cell's runs (module docstring: which runs), and the runs left out.
    A cell without a run directory holding a summary is not in the list."""
    cells: dict[str, CellResult] = {}
    excluded = []
    for cell in experiment.cells:
        run_dir = experiment.directory / cell.name
        if not (run_dir / "config.yaml").is_file():
            continue
        loaded, skipped = load_runs([run_dir])
        if skipped:
            excluded.append(Excluded(cell.name, skipped[0].reason))
            continue
        run = loaded[0]
        if not run.summary:
            continue  # not started
        try:
            difference = config_change(run_dir, cell.config)
        except ConfigError as err:
            excluded.append(Excluded(cell.name, f"config.yaml is not a valid config: {err}"))
            continue
        if difference:
            excluded.append(Excluded(cell.name, "config differs from the experiment's: " + "; ".join(difference)))
            continue
        key = canonical(cell.settings)
        if key not in cells:
            m = cell.config.model
            theory = math.sqrt(m.d_k) * score_scale(m.scale, m.d_k) * m.qk_gain**2
            cells[key] = CellResult(dict(cell.settings), [], [], theory)
        cells[key].runs.append(run)
        if run.status in FINISHED:
            cells[key].seeds.append(seed_of(run, cell.seed))
    return list(cells.values()), excluded


def _keys(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def layout(experiment: Experiment) -> tuple[list[str], list[str], str | None]:
    """(x keys, arm keys, best_of key) from the experiment's report section.
    Several x keys make a categorical axis of their combinations. By default
    x is the first grid key and the arm the next one that is not best_of."""
    spec = experiment.report
    best_of = spec.get("best_of")
    grid = [k for k in experiment.grid_keys if k != best_of]
    x = _keys(spec.get("x")) or grid[:1]
    arm = _keys(spec.get("arm")) or [k for k in grid if k not in x][:1]
    return x, arm, best_of


def x_value(r: CellResult, x: list[str], names: dict[str, str]):
    """The cell's position on the x axis: the value of a single key (a
    mapping or list as its text), else a label of the keys' values."""
    if len(x) > 1:
        return _label(r.settings, x, names)
    value = r.settings.get(x[0])
    return format_value(value) if isinstance(value, (dict, list)) else value


def x_name(x: list[str], names: dict[str, str]) -> str:
    return " / ".join(names[k] for k in x)


# ---------------------------------------------------------------------------
# best_of: each cell at its best value of one grid key
# ---------------------------------------------------------------------------
def best_of_groups(results: list[CellResult], best_of: str) -> list[list[CellResult]]:
    """The cells that differ only in `best_of`, together."""
    groups: dict[str, list[CellResult]] = {}
    for r in results:
        groups.setdefault(canonical({k: v for k, v in r.settings.items() if k != best_of}), []).append(r)
    return list(groups.values())


def selection_score(r: CellResult) -> tuple[float, float]:
    """(mean steps to 99% with never = budget, mean final eval loss with a
    diverged seed as +inf): smaller is better."""
    losses = r.final_losses()
    mean_loss = float(np.where(np.isfinite(losses), losses, np.inf).mean()) if len(losses) else math.inf
    return r.censored_mean_steps(), mean_loss


def select_best(results: list[CellResult], best_of: str | None) -> list[CellResult]:
    """For each cell without `best_of`, the value of `best_of` with the fewest
    steps to 99%: the mean over its finished seeds, a seed that never got
    there counted as the budget (censored), the quantity the report compares;
    ties are broken by the lower mean final eval loss (a diverged seed
    counting as +inf)."""
    if not best_of:
        return results
    return [min(group, key=selection_score) for group in best_of_groups(results, best_of)]


def edge_notes(results: list[CellResult], best_of: str | None, names: dict[str, str]) -> list[str]:
    """A sentence for each chosen cell whose numeric best_of value is the
    lowest or highest of the values tried: the best may lie beyond the grid."""
    if not best_of:
        return []
    notes = []
    for group in best_of_groups(results, best_of):
        tried = sorted({r.settings[best_of] for r in group if runs.is_finite_number(r.settings.get(best_of))})
        chosen = min(group, key=selection_score).settings.get(best_of)
        if len(tried) < 2 or chosen not in (tried[0], tried[-1]):
            continue
        rest = [k for k in group[0].settings if k != best_of]
        notes.append(f"- {_label(group[0].settings, rest, names)}: `{best_of}` = {format_value(chosen)} is the "
                     f"{'lowest' if chosen == tried[0] else 'highest'} value tried "
                     f"({', '.join(format_value(v) for v in tried)}): the best may lie beyond the grid.")
    return notes


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------
def _label(settings: dict, keys: list[str], names: dict[str, str]) -> str:
    return ", ".join(f"{names[k]}={format_value(settings[k])}" for k in keys if k in settings) or "all runs"


def _cell_value(value):
    return format_value(value) if isinstance(value, (dict, list)) else value


def table_rows(results: list[CellResult], keys: list[str], names: dict[str, str]) -> list[dict]:
    rows = []
    for r in results:
        statuses = r.statuses()
        seeds = r.seeds

        def stat(values, spec=".3g"):
            return format_stat(describe(list(values)), spec)

        row = {names[k]: _cell_value(r.settings.get(k)) for k in keys}
        row.update({
            "seeds": len(r.runs),
            "status": ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses))),
            "final eval loss": stat(s.final_loss for s in seeds),
            "final eval acc": stat(s.final_accuracy for s in seeds),
            "best eval loss": stat(s.best_loss for s in seeds),
            "best eval acc": stat(s.best_accuracy for s in seeds),
            f"steps to {THRESHOLD:.0%}": format_steps(describe(r.steps_to_99())) if seeds else "—",
            "score std @init": stat(r.at_init("score_std")),
            "theory √d_k·s·g²": f"{r.theory_score_std:.3g}",
            "entropy @init": stat(r.at_init("attn_entropy")),
            "saturated @init": stat(r.at_init("saturated_frac")),
            "‖∇W_q‖ @init": stat(r.at_init("grad_norm/W_q")),
            "‖∇W_k‖ @init": stat(r.at_init("grad_norm/W_k")),
        })
        rows.append(row)
    return rows


TABLE_NOTE = (f"Mean ± sample std over the finished (completed or diverged) seeds of each cell; (k/n): only k of "
              "its n finished seeds have a value (a diverged seed has no final figures); best: over the records "
              f"with a finite eval loss; steps to {THRESHOLD:.0%}: the first logged step with eval accuracy ≥ "
              f"{THRESHOLD:g}, over the seeds that reached it; interrupted, running and failed runs are counted "
              "under status only.")


def _markdown_table(rows: list[dict]) -> str:
    header = list(rows[0])
    return runs.markdown_table(header, [[row[h] for h in header] for row in rows])


def _csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# ---------------------------------------------------------------------------
# Conclusion, from the numbers
# ---------------------------------------------------------------------------
def conclusion(results: list[CellResult], x: list[str], arms: list[str], names: dict[str, str]) -> list[str]:
    """For each x value, one line per arm computed from the data: how many
    seeds reached 99% and how fast, how much slower than the fastest arm,
    and what became of the seeds (module docstring: fates)."""
    lines = []
    by_x: dict = {}
    for r in results:
        by_x.setdefault(x_value(r, x, names), []).append(r)
    for xv in sorted(by_x, key=_sort_key):
        cells = by_x[xv]
        complete = [r.censored_mean_steps() for r in cells if r.seeds and None not in r.steps_to_99()]
        fastest = min(complete) if len(cells) > 1 and complete else None
        lines.append(f"- **{x_name(x, names)} = {xv}**")
        lines += [f"  - {cell_sentence(r, arms, fastest, names)}" for r in cells]
    return lines


def cell_sentence(r: CellResult, arms: list[str], fastest: float | None, names: dict[str, str]) -> str:
    """One arm at one x value, e.g. 'scale=none: 2/5 seeds reached 99%, those
    in 255 steps on average (≥ 7.3× the fastest arm, counting never as 500
    steps); of the 3 that did not: 3 never left the plateau (...)'."""
    label = _label(r.settings, arms, names)
    unfinished = r.unfinished()
    not_counted = ("; not counted: " + ", ".join(f"{n} {status}" for status, n in sorted(unfinished.items()))
                   if unfinished else "")
    n = len(r.seeds)
    if not n:
        return f"{label}: no finished seed{not_counted}."
    reached = [s for s in r.steps_to_99() if s is not None]
    text = f"{label}: {len(reached)}/{n} seeds reached {THRESHOLD:.0%}"
    if len(reached) == n:
        text += f", in {np.mean(reached):.0f} steps on average"
        if fastest is not None and np.mean(reached) > fastest:
            text += f" ({np.mean(reached) / fastest:.1f}× the fastest arm)"
    else:
        text += f", those in {np.mean(reached):.0f} steps on average" if reached else f" within {r.budget} steps"
        if fastest is not None:
            text += f" (≥ {r.censored_mean_steps() / fastest:.1f}× the fastest arm, counting never as {r.budget} steps)"
    fates = Counter(s.fate for s in r.seeds)
    after = [_fate_clause(r.seeds, fate, "of them ") for fate in REACHED_FATES if fate != KEPT and fates[fate]]
    missed = [_fate_clause(r.seeds, fate) for fate in MISSED_FATES if fates[fate]]
    if after:
        text += "; " + ", ".join(after)
    if missed:
        text += "; " + (f"of the {n - len(reached)} that did not: " if reached else "") + ", ".join(missed)
    return text + not_counted + "."


def _fate_clause(seeds: list[Seed], fate: str, of_them: str = "") -> str:
    """'2 learned, then lost it (best eval acc 0.93, 0.98)': the count, the
    fate, and the figure that shows it, per seed."""
    members = [s for s in seeds if s.fate == fate]
    shown = {ENDED_BELOW: ("final eval acc", lambda s: s.final_accuracy, ".3f"),
             PLATEAU: ("best eval loss", lambda s: s.best_loss, ".3g"),
             LOST: ("best eval acc", lambda s: s.best_accuracy, ".3f"),
             SHORT: ("final eval acc", lambda s: s.final_accuracy, ".3f")}.get(fate)
    text = f"{len(members)} {of_them}{fate}"
    if shown is not None:
        name, figure, spec = shown
        values = sorted(figure(s) for s in members if figure(s) is not None)
        text += f" ({name} {', '.join(format(v, spec) for v in values)})" if values else ""
    return text


def fates_note(results: list[CellResult]) -> str:
    """What the fates mean, with the plateau level(s) of the seeds."""
    levels = sorted({s.plateau for r in results for s in r.seeds if s.plateau is not None})
    shown = (f"L = {levels[0]:.3f} nats" if len(levels) == 1 else
             f"L = {', '.join(f'{v:.3f}' for v in levels)} nats by task" if levels else "L unknown")
    return (f"A seed that did not reach {THRESHOLD:.0%} *never left the plateau* if its best eval loss stayed above "
            f"{PLATEAU_FRACTION:g} L, where L is the plateau level (the no-retrieval loss, or chance where the task "
            f"has none; {shown}); it *learned, then lost it* if it went below {PLATEAU_FRACTION:g} L but ended "
            f"above it; it *left the plateau, ended short of {THRESHOLD:.0%}* if it ended below it too. Means of "
            "steps count only the seeds that reached the threshold; the ratio to the fastest arm (the fastest "
            "whose seeds all got there) counts a seed that never did as the budget, a lower bound (≥).")


def _sort_key(value):
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def expectation_check(results: list[CellResult], x: list[str], arms: list[str], references: dict,
                      names: dict[str, str]) -> list[str]:
    """The headline's expectations, tested against the data: only for
    x = model.d_k and the arms model.scale alone, with both `sqrt` and `none`."""
    if x != ["model.d_k"] or arms != ["model.scale"]:
        return []
    arm_key = arms[0]
    sqrt_cells = [r for r in results if r.settings.get(arm_key) == "sqrt"]
    none_cells = sorted((r for r in results if r.settings.get(arm_key) == "none" and r.seeds),
                        key=lambda r: _sort_key(x_value(r, x, names)))
    if not sqrt_cells or not none_cells:
        return []
    out = []
    n_scaled = sum(len(r.seeds) for r in sqrt_cells)
    n_learned = sum(s is not None for r in sqrt_cells for s in r.steps_to_99())
    worst = max((s for r in sqrt_cells for s in r.steps_to_99() if s is not None), default=None)
    verdict = "confirmed" if n_learned == n_scaled else "NOT confirmed"
    out.append(f"- Scaled runs learn at every {x_name(x, names)}: {verdict} — {n_learned}/{n_scaled} seeds "
               f"reached {THRESHOLD:.0%}" + (f", the slowest in {worst} steps." if worst is not None else "."))
    largest = none_cells[-1]
    stuck = [s for s in largest.seeds if s.steps_to_99 is None]
    n = len(largest.seeds)
    verdict = "confirmed" if len(stuck) > n / 2 else "NOT confirmed"
    diverged = sum(s.run.status == "diverged" for s in stuck)
    out.append(f"- Unscaled runs at the largest {x_name(x, names)} ({x_value(largest, x, names)}) fail to learn in "
               f"most seeds: {verdict} — {len(stuck)}/{n} did not reach {THRESHOLD:.0%} within {largest.budget} "
               f"steps ({diverged} of them diverged).")
    plateau = references.get("no_retrieval")
    if plateau is not None:
        waits = [(x_value(r, x, names),
                  mean_std([_fraction_not_retrieving(s.run.records, plateau, r.budget) for s in r.seeds]))
                 for r in none_cells]
        growing = all(b[0] >= a[0] for (_, a), (_, b) in zip(waits, waits[1:]))
        verdict = "confirmed" if growing else "NOT confirmed (not monotone)"
        out.append(f"- Unscaled runs take longer to leave the no-retrieval plateau ({plateau:.3f} nats) as "
                   f"{x_name(x, names)} grows: {verdict} — fraction of the budget before the eval loss first drops "
                   f"below {PLATEAU_FRACTION:.0%} of it (1 = never; mean ± std over seeds): "
                   + ", ".join(f"{xv}: {m:.2f} ± {sd:.2f}" for xv, (m, sd) in waits) + ".")
    return out


def _fraction_not_retrieving(records: list[dict], no_retrieval: float, budget: int) -> float:
    """Fraction of the budget before the eval loss first drops below
    PLATEAU_FRACTION of the no-retrieval level (before the model starts to
    retrieve); 1 if it never does."""
    steps, values = series(records, "eval_loss")
    below = steps[values < PLATEAU_FRACTION * no_retrieval]
    return float(below[0]) / budget if below.size else 1.0


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------
def _arm_colors(results: list[CellResult], arms: list[str], names: dict[str, str]) -> dict[str, str]:
    labels = sorted({_label(r.settings, arms, names) for r in results})
    palette = [f"C{i}" for i in range(10)]
    return {label: palette[i % 10] for i, label in enumerate(labels)}


def _panels(n: int, width: float = 3.6, height: float = 3.0):
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.4))
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def _curves_figure(results, x, arms, names, colors, key, ylabel, log_y, references, path, title):
    xs = sorted({x_value(r, x, names) for r in results}, key=_sort_key)
    fig, axes = _panels(len(xs))
    for ax, xv in zip(axes, xs):
        for r in (r for r in results if x_value(r, x, names) == xv and r.seeds):
            curve = band_stats([series(s.run.records, key) for s in r.seeds])
            if not curve.steps.size:
                continue
            label = _label(r.settings, arms, names)
            ax.plot(curve.steps, curve.mean, color=colors[label], label=f"{label} (n={len(r.seeds)})", linewidth=1.4)
            ax.fill_between(curve.steps, *curve.edges(), color=colors[label], alpha=0.2, linewidth=0)
        if references:
            draw_references(ax, references)
        if log_y:
            ax.set_yscale("log")
        ax.set_title(f"{x_name(x, names)} = {xv}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _x_positions(results, x, names, ax) -> dict:
    """x value -> position on ax: the value itself on a log axis when all x
    values are positive numbers, else evenly spaced categories."""
    xs = sorted({x_value(r, x, names) for r in results}, key=_sort_key)
    if _numeric(xs) and min(xs) > 0:
        ax.set_xscale("log")
        return {xv: xv for xv in xs}
    ax.set_xticks(range(len(xs)), [str(v).replace(", ", "\n") for v in xs])
    return {xv: i for i, xv in enumerate(xs)}


def _steps_figure(results, x, arms, names, colors, path):
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    position = _x_positions(results, x, names, ax)
    budget = max(r.budget for r in results)
    for arm_index, label in enumerate(colors):
        cells = sorted((r for r in results if _label(r.settings, arms, names) == label),
                       key=lambda r: _sort_key(x_value(r, x, names)))
        px, means, stds = [], [], []
        for r in cells:
            reached = [s for s in r.steps_to_99() if s is not None]
            never = len(r.seeds) - len(reached)
            if reached:
                m, s = mean_std(reached)
                px.append(position[x_value(r, x, names)])
                means.append(m)
                stds.append(s)
            if never:
                ax.scatter([position[x_value(r, x, names)]], [budget], marker="x", color=colors[label], s=50)
                ax.annotate(f"never {never}/{len(r.seeds)}", (position[x_value(r, x, names)], budget),
                            fontsize=7, color=colors[label], textcoords="offset points", xytext=(4, -10 - 9 * arm_index))
        if px:
            ax.errorbar(px, means, yerr=stds, color=colors[label], marker="o", capsize=3, label=label)
    ax.axhline(budget, color="0.5", linestyle=":", linewidth=1, label=f"budget ({budget} steps)")
    ax.set_yscale("log")
    ax.set_xlabel(x_name(x, names))
    ax.set_ylabel(f"steps to {THRESHOLD:.0%} eval accuracy (seeds that got there)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _score_std_figure(results, x, arms, names, colors, path):
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    position = _x_positions(results, x, names, ax)
    for label in colors:
        cells = sorted((r for r in results if _label(r.settings, arms, names) == label),
                       key=lambda r: _sort_key(x_value(r, x, names)))
        xs = [position[x_value(r, x, names)] for r in cells]
        measured = [mean_std(r.at_init("score_std")) for r in cells]
        ax.errorbar(xs, [m for m, _ in measured], yerr=[s for _, s in measured], color=colors[label], marker="o",
                    linestyle="none", capsize=3, label=f"{label}: measured")
        ax.plot(xs, [r.theory_score_std for r in cells], color=colors[label], linestyle="--", linewidth=1,
                label=f"{label}: theory √d_k·s·g²")
    ax.set_yscale("log")
    ax.set_xlabel(x_name(x, names))
    ax.set_ylabel("std of scores at initialisation")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _outcome_map(results, arms, names, colors, path):
    """Every finished seed as a point: x = measured score std at init; y =
    steps to 99% (left) and final eval loss (right)."""
    fig = Figure(figsize=(11, 4.2))
    ax_steps, ax_loss = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    budget = max(r.budget for r in results)
    for r in results:
        label = _label(r.settings, arms, names)
        std0 = r.at_init("score_std")
        steps = np.array([s if s is not None else np.nan for s in r.steps_to_99()], dtype=float)
        reached = np.isfinite(steps) & np.isfinite(std0)
        ax_steps.scatter(std0[reached], steps[reached], color=colors[label], s=18, alpha=0.8)
        never = ~np.isfinite(steps) & np.isfinite(std0)
        ax_steps.scatter(std0[never], np.full(never.sum(), budget * 1.15), color=colors[label], marker="x", s=22)
        loss = r.final_losses()
        ok = np.isfinite(loss) & np.isfinite(std0)
        ax_loss.scatter(std0[ok], loss[ok], color=colors[label], s=18, alpha=0.8)
    for label, color in colors.items():
        ax_steps.scatter([], [], color=color, label=label)
    ax_steps.axhline(budget, color="0.5", linestyle=":", linewidth=1)
    ax_steps.scatter([], [], color="0.3", marker="x", label="never reached (drawn above the budget)")
    for ax, ylabel in ((ax_steps, f"steps to {THRESHOLD:.0%} eval accuracy"), (ax_loss, "final eval loss")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("std of scores at initialisation (measured, per seed)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.25)
    ax_steps.legend(fontsize=7)
    fig.suptitle("outcome against score std at initialisation, every finished run", fontsize=11)
    return save_figure(fig, path)


# ---------------------------------------------------------------------------
def source_revisions(results: list) -> list[str]:
    """The distinct attn commits recorded in the provenance of the runs reported."""
    revisions = set()
    for run in (run for r in results for run in r.runs):
        try:
            provenance = runs.read_run_config(run.path).get("provenance") or {}
        except runs.RunError:
            continue
        revisions.add(str(provenance.get("attn_commit") or "unknown"))
    return sorted(revisions) or ["unknown"]


def write_report(experiment: Experiment) -> dict[str, Path]:
    """Compute the report of an experiment from its run directories and write
    report.md, report.csv and the figures into the experiment directory,
    holding its runs.RunLock (one report writer at a time; another is refused)."""
    out = experiment.directory
    all_results, excluded = collect(experiment)
    if not all_results:
        left_out = f" ({len(excluded)} left out: {excluded[0].name}: {excluded[0].reason}, ...)" if excluded else ""
        raise runs.RunError(f"{out}: no runs of this experiment yet{left_out}; "
                            f"run `python -m attn sweep {experiment.path}` first")
    with runs.RunLock(out, "report"):
        return _write(experiment, all_results, excluded)


def _write(experiment: Experiment, all_results: list[CellResult], excluded: list[Excluded]) -> dict[str, Path]:
    """write_report's files, from the cells collected."""
    out = experiment.directory
    x, arms, best_of = layout(experiment)
    names = short_names(list(experiment.grid_keys))
    results = select_best(all_results, best_of)
    finished = [s.run for r in results for s in r.seeds]
    references = shared_references(finished) if finished else {}
    colors = _arm_colors(results, arms, names)
    keys = x + arms + ([best_of] if best_of else [])
    rows = table_rows(sorted(results, key=lambda r: tuple(_sort_key(_cell_value(r.settings.get(k))) for k in keys)),
                      keys, names)
    paths = {"csv": out / "report.csv", "md": out / "report.md"}
    runs.write_atomic(paths["csv"], _csv_text(rows).encode())
    paths["loss_curves"] = _curves_figure(results, x, arms, names, colors, "eval_loss", "eval loss (nats)", True,
                                          references, out / "loss_curves.png",
                                          f"{experiment.name}: eval loss, mean ± std over seeds")
    paths["entropy"] = _curves_figure(results, x, arms, names, colors, "attn_entropy", "attention entropy (nats)",
                                      False, {}, out / "entropy.png",
                                      f"{experiment.name}: attention entropy of the query rows")
    paths["steps_to_99"] = _steps_figure(results, x, arms, names, colors, out / "steps_to_99.png")
    paths["score_std_init"] = _score_std_figure(results, x, arms, names, colors, out / "score_std_init.png")
    map_arms = arms + ([best_of] if best_of else [])
    paths["outcome_map"] = _outcome_map(all_results, map_arms, names, _arm_colors(all_results, map_arms, names),
                                         out / "outcome_map.png")
    n_runs = sum(len(r.runs) for r in all_results)
    n_finished = sum(len(r.seeds) for r in all_results)
    text = [f"# {experiment.name}", "", experiment.description.strip(), "",
            f"{n_runs} runs of {len(experiment.cells)} from `{experiment.path}` ({n_finished} finished); x = "
            + ", ".join(f"`{k}`" for k in x) + ", arms = " + ", ".join(f"`{a}`" for a in arms) + ".",
            "", "Made by attn " + ", ".join(f"`{c}`" for c in source_revisions(all_results))
            + " (the `attn_commit` in the runs' config.yaml); Python and numpy versions are there too."]
    if best_of:
        text += ["", f"Each cell at the `{best_of}` with the fewest steps to {THRESHOLD:.0%} (mean over its "
                 "finished seeds, never = budget; ties: the lower mean final eval loss)."]
        text += edge_notes(all_results, best_of, names)
    text += ["", _markdown_table(rows), "", TABLE_NOTE, "", "## Conclusion (computed from the runs)", ""]
    text += conclusion(results, x, arms, names) + ["", fates_note(results)]
    checks = expectation_check(results, x, arms, references, names)
    if checks:
        text += ["", "## Expectations, tested", ""] + checks
    if excluded:
        text += ["", f"## Runs left out ({len(excluded)})", ""] + [f"- `{e.name}`: {e.reason}" for e in excluded]
    text += ["", "Figures: " + ", ".join(f"`{p.name}`" for k, p in paths.items() if p.suffix == ".png"), ""]
    runs.write_atomic(paths["md"], "\n".join(text).encode())
    return paths
