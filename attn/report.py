"""An experiment's report, computed from its run directories only.

For each cell of the grid (one config, several seeds) the report gives,
as mean ± std over seeds:
    final eval loss and accuracy;
    steps to 99% eval accuracy (over the seeds that got there, and how many never did);
    at initialisation (the step-0 record): score std beside the theory value
    sqrt(d_k) * s * qk_gain^2, attention entropy, saturated-row fraction,
    ||grad W_q|| and ||grad W_k||.
It writes report.md (table + conclusion), report.csv, and figures:
    loss_curves.png      eval loss of each arm per x value, mean ± std band over seeds
    steps_to_99.png      steps to 99% accuracy against x, per arm
    score_std_init.png   score std at init against x (log-log) with the theory line
    entropy.png          attention entropy over training, per arm and x value
    outcome_map.png      steps to 99% and final loss against score std at init: every cell

The experiment file's `report:` section names the grid key on the x axis
(`x`), the key(s) whose values are the compared arms (`arm`), and optionally
a key to optimise away (`best_of`: for each remaining cell keep the value
with the lowest mean final eval loss, e.g. each optimiser at its best rate).
The conclusion is generated from the numbers; nothing in it is typed in.
Statistics over seeds are attn.compare's: mean ± sample std, bands clipped
to the range of the seeds' values.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attn import runs
from attn.compare import band_stats, describe
from attn.layers import score_scale
from attn.plots import draw_references, save_figure, series
from attn.sweep import Experiment

THRESHOLD = 0.99


@dataclass
class CellResult:
    """All seeds of one grid cell, read back from their run directories."""

    settings: dict  # grid key -> value
    seeds: list[int]
    records: list[list[dict]]  # metrics per seed
    summaries: list[dict]
    theory_score_std: float

    def final(self, key: str) -> np.ndarray:
        """Per-seed final value of a summary figure (nan where missing/non-finite)."""
        return np.array([_finite(s.get("final", {}).get(key)) for s in self.summaries])

    def at_init(self, key: str) -> np.ndarray:
        return np.array([_finite(r[0].get(key)) if r and r[0]["step"] == 0 else math.nan for r in self.records])

    def steps_to_99(self) -> list[int | None]:
        return [s.get("best", {}).get("steps_to_99") for s in self.summaries]

    def statuses(self) -> list[str]:
        return [runs.effective_status(s) for s in self.summaries]

    @property
    def budget(self) -> int:
        return max(s.get("steps", 0) for s in self.summaries)


def _finite(value) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def mean_std(values) -> tuple[float, float]:
    """Mean and sample std over the finite values (attn.compare.describe);
    nan where there are too few values."""
    stat = describe(list(values))
    return (math.nan if stat.mean is None else stat.mean, math.nan if stat.std is None else stat.std)


def collect(experiment: Experiment) -> list[CellResult]:
    """Read every cell's run directories (missing runs are left out)."""
    cells: dict[tuple, CellResult] = {}
    for cell in experiment.cells:
        run_dir = experiment.directory / cell.name
        summary = runs.read_summary(run_dir) if run_dir.is_dir() else None
        if summary is None:
            continue
        key = cell.settings
        if key not in cells:
            m = cell.config.model
            theory = math.sqrt(m.d_k) * score_scale(m.scale, m.d_k) * m.qk_gain**2
            cells[key] = CellResult(dict(cell.settings), [], [], [], theory)
        result = cells[key]
        result.seeds.append(cell.seed)
        result.records.append(runs.read_metrics(run_dir))
        result.summaries.append(summary)
    return list(cells.values())


def _keys(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def layout(experiment: Experiment) -> tuple[list[str], list[str], str | None]:
    """(x keys, arm keys, best_of key) from the experiment's report section.
    Several x keys make a categorical axis of their combinations."""
    spec = experiment.report
    grid = list(experiment.grid_keys)
    x = _keys(spec.get("x")) or grid[:1]
    arm = _keys(spec.get("arm")) or [k for k in grid if k not in x][:1]
    return x, arm, spec.get("best_of")


def x_value(r: "CellResult", x: list[str]):
    """The cell's position on the x axis: the value of a single key, else a label."""
    return r.settings.get(x[0]) if len(x) == 1 else _label(r.settings, x)


def x_name(x: list[str]) -> str:
    return " / ".join(k.rsplit(".", 1)[-1] for k in x)


def select_best(results: list[CellResult], best_of: str | None) -> list[CellResult]:
    """For each cell without `best_of`, the value of `best_of` with the lowest
    mean final eval loss (diverged seeds count as +inf)."""
    if not best_of:
        return results
    groups: dict[tuple, list[CellResult]] = {}
    for r in results:
        rest = tuple((k, v) for k, v in r.settings.items() if k != best_of)
        groups.setdefault(rest, []).append(r)

    def score(r: CellResult) -> float:
        losses = r.final("eval_loss")
        return float(np.where(np.isfinite(losses), losses, np.inf).mean())

    return [min(group, key=score) for group in groups.values()]


def _label(settings: dict, keys: list[str]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={settings[k]}" for k in keys if k in settings) or "all runs"


def _fmt(mean: float, std: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "—"
    return f"{mean:.{digits}g}" + ("" if math.isnan(std) else f" ± {std:.2g}")


def _steps_text(r: CellResult) -> str:
    reached = [s for s in r.steps_to_99() if s is not None]
    never = len(r.summaries) - len(reached)
    text = _fmt(*mean_std(reached), digits=4) if reached else ""
    if never:
        text += f"{'; ' if text else ''}never ({never}/{len(r.summaries)})"
    return text


def table_rows(results: list[CellResult], keys: list[str]) -> list[dict]:
    rows = []
    for r in results:
        statuses = r.statuses()
        row = {k.rsplit(".", 1)[-1]: r.settings.get(k) for k in keys}
        row.update({
            "seeds": len(r.seeds),
            "status": ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses))),
            "final eval loss": _fmt(*mean_std(r.final("eval_loss"))),
            "final eval acc": _fmt(*mean_std(r.final("eval_accuracy"))),
            f"steps to {THRESHOLD:.0%}": _steps_text(r),
            "score std @init": _fmt(*mean_std(r.at_init("score_std"))),
            "theory √d_k·s·g²": f"{r.theory_score_std:.3g}",
            "entropy @init": _fmt(*mean_std(r.at_init("attn_entropy"))),
            "saturated @init": _fmt(*mean_std(r.at_init("saturated_frac"))),
            "‖∇W_q‖ @init": _fmt(*mean_std(r.at_init("grad_norm/W_q"))),
            "‖∇W_k‖ @init": _fmt(*mean_std(r.at_init("grad_norm/W_k"))),
        })
        rows.append(row)
    return rows


def _markdown_table(rows: list[dict]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[h]) for h in header) + " |" for row in rows]
    return "\n".join(lines)


def _csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# ---------------------------------------------------------------------------
# Conclusion, from the numbers
# ---------------------------------------------------------------------------
def conclusion(results: list[CellResult], x: str, arms: list[str]) -> list[str]:
    """Sentences computed from the data: which cells stalled or diverged, and
    how much slower each arm was than the fastest arm at the same x."""
    lines = []
    by_x: dict = {}
    for r in results:
        by_x.setdefault(x_value(r, x), []).append(r)
    for xv in sorted(by_x, key=_sort_key):
        cells = by_x[xv]
        reached = {_label(r.settings, arms): [s for s in r.steps_to_99() if s is not None] for r in cells}
        best_mean = min((np.mean(v) for v in reached.values() if v), default=math.nan)
        parts = []
        for r in cells:
            label = _label(r.settings, arms)
            n = len(r.summaries)
            statuses = r.statuses()
            ok = reached[label]
            text = f"{label}: {len(ok)}/{n} seeds reached {THRESHOLD:.0%}"
            if ok:
                text += f" in {np.mean(ok):.0f} steps on average"
                if len(cells) > 1 and np.isfinite(best_mean) and np.mean(ok) > best_mean:
                    text += f" ({np.mean(ok) / best_mean:.1f}× the fastest arm)"
            diverged = [steps for status, steps in zip(statuses, r.steps_to_99()) if status == "diverged"]
            stalled = [s for s, steps in zip(r.summaries, r.steps_to_99()) if steps is None and s.get("status") == "completed"]
            if stalled:
                losses = [s["final"].get("eval_loss", math.nan) for s in stalled]
                text += f"; {len(stalled)} stalled (final eval loss {np.nanmean(losses):.3g} after {r.budget} steps)"
            if diverged:
                after = sum(steps is not None for steps in diverged)
                text += f"; {len(diverged)} diverged" + (f" ({after} of them after reaching {THRESHOLD:.0%})" if after else "")
            parts.append(text)
        lines.append(f"- **{x_name(x)} = {xv}** — " + "; ".join(parts) + ".")
    return lines


def _sort_key(value):
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def expectation_check(results: list[CellResult], x: str, arm_key: str, references: dict) -> list[str]:
    """The headline's expectations, tested against the data (only for a
    numeric x and the arms model.scale alone, with both `sqrt` and `none`)."""
    if arm_key != "model.scale":
        return []
    sqrt_cells = [r for r in results if r.settings.get(arm_key) == "sqrt"]
    none_cells = sorted((r for r in results if r.settings.get(arm_key) == "none"), key=lambda r: _sort_key(x_value(r, x)))
    if not sqrt_cells or not none_cells:
        return []
    out = []
    n_scaled = sum(len(r.summaries) for r in sqrt_cells)
    n_learned = sum(s is not None for r in sqrt_cells for s in r.steps_to_99())
    worst = max((s for r in sqrt_cells for s in r.steps_to_99() if s is not None), default=None)
    verdict = "confirmed" if n_learned == n_scaled else "NOT confirmed"
    out.append(f"- Scaled runs learn at every {x_name(x)}: {verdict} — {n_learned}/{n_scaled} seeds "
               f"reached {THRESHOLD:.0%}" + (f", the slowest in {worst} steps." if worst is not None else "."))
    largest = none_cells[-1]
    stuck = sum(s is None for s in largest.steps_to_99())
    n = len(largest.summaries)
    verdict = "confirmed" if stuck > n / 2 else "NOT confirmed"
    out.append(f"- Unscaled runs at the largest {x_name(x)} ({x_value(largest, x)}) fail to learn in most seeds: "
               f"{verdict} — {stuck}/{n} did not reach {THRESHOLD:.0%} within {largest.budget} steps "
               f"({largest.statuses().count('diverged')} of them diverged).")
    plateau = references.get("no_retrieval")
    if plateau is not None:
        stuck = []
        for r in none_cells:
            stuck.append((x_value(r, x), mean_std([_fraction_not_retrieving(recs, plateau, r.budget) for recs in r.records])))
        growing = all(b[0] >= a[0] for (_, a), (_, b) in zip(stuck, stuck[1:]))
        verdict = "confirmed" if growing else "NOT confirmed (not monotone)"
        out.append(f"- Unscaled runs take longer to leave the no-retrieval plateau ({plateau:.3f} nats) as "
                   f"{x_name(x)} grows: {verdict} — fraction of the budget before the eval loss first drops "
                   "below 90% of it (1 = never; mean ± std over seeds): "
                   + ", ".join(f"{xv}: {m:.2f} ± {sd:.2f}" for xv, (m, sd) in stuck) + ".")
    return out


def _fraction_not_retrieving(records: list[dict], no_retrieval: float, budget: int) -> float:
    """Fraction of the budget before the eval loss first drops below 90% of
    the no-retrieval level (before the model starts to retrieve); 1 if it never does."""
    steps, values = series(records, "eval_loss")
    below = steps[values < 0.9 * no_retrieval]
    return float(below[0]) / budget if below.size else 1.0


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------
def _arm_colors(results: list[CellResult], arms: list[str]) -> dict[str, str]:
    labels = sorted({_label(r.settings, arms) for r in results})
    palette = [f"C{i}" for i in range(10)]
    return {label: palette[i % 10] for i, label in enumerate(labels)}


def _panels(n: int, width: float = 3.6, height: float = 3.0):
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.4))
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def _curves_figure(results, x, arms, colors, key, ylabel, log_y, references, path, title):
    xs = sorted({x_value(r, x) for r in results}, key=_sort_key)
    fig, axes = _panels(len(xs))
    for ax, xv in zip(axes, xs):
        for r in (r for r in results if x_value(r, x) == xv):
            curve = band_stats([series(records, key) for records in r.records])
            if not curve.steps.size:
                continue
            label = _label(r.settings, arms)
            ax.plot(curve.steps, curve.mean, color=colors[label], label=f"{label} (n={len(r.seeds)})", linewidth=1.4)
            ax.fill_between(curve.steps, *curve.edges(), color=colors[label], alpha=0.2, linewidth=0)
        if references:
            draw_references(ax, references)
        if log_y:
            ax.set_yscale("log")
        ax.set_title(f"{x_name(x)} = {xv}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _x_positions(results, x, ax) -> dict:
    """x value -> position on ax: the value itself on a log axis when all x
    values are positive numbers, else evenly spaced categories."""
    xs = sorted({x_value(r, x) for r in results}, key=_sort_key)
    if _numeric(xs) and min(xs) > 0:
        ax.set_xscale("log")
        return {xv: xv for xv in xs}
    ax.set_xticks(range(len(xs)), [str(v).replace(", ", "\n") for v in xs])
    return {xv: i for i, xv in enumerate(xs)}


def _steps_figure(results, x, arms, colors, path):
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    position = _x_positions(results, x, ax)
    budget = max(r.budget for r in results)
    for arm_index, label in enumerate(colors):
        cells = sorted((r for r in results if _label(r.settings, arms) == label), key=lambda r: _sort_key(x_value(r, x)))
        px, means, stds = [], [], []
        for r in cells:
            reached = [s for s in r.steps_to_99() if s is not None]
            never = len(r.summaries) - len(reached)
            if reached:
                m, s = mean_std(reached)
                px.append(position[x_value(r, x)])
                means.append(m)
                stds.append(s)
            if never:
                ax.scatter([position[x_value(r, x)]], [budget], marker="x", color=colors[label], s=50)
                ax.annotate(f"never {never}/{len(r.summaries)}", (position[x_value(r, x)], budget),
                            fontsize=7, color=colors[label], textcoords="offset points", xytext=(4, -10 - 9 * arm_index))
        if px:
            ax.errorbar(px, means, yerr=stds, color=colors[label], marker="o", capsize=3, label=label)
    ax.axhline(budget, color="0.5", linestyle=":", linewidth=1, label=f"budget ({budget} steps)")
    ax.set_yscale("log")
    ax.set_xlabel(x_name(x))
    ax.set_ylabel(f"steps to {THRESHOLD:.0%} eval accuracy")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _score_std_figure(results, x, arms, colors, path):
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    position = _x_positions(results, x, ax)
    for label in colors:
        cells = sorted((r for r in results if _label(r.settings, arms) == label), key=lambda r: _sort_key(x_value(r, x)))
        xs = [position[x_value(r, x)] for r in cells]
        measured = [mean_std(r.at_init("score_std")) for r in cells]
        ax.errorbar(xs, [m for m, _ in measured], yerr=[s for _, s in measured], color=colors[label], marker="o",
                    linestyle="none", capsize=3, label=f"{label}: measured")
        ax.plot(xs, [r.theory_score_std for r in cells], color=colors[label], linestyle="--", linewidth=1,
                label=f"{label}: theory √d_k·s·g²")
    ax.set_yscale("log")
    ax.set_xlabel(x_name(x))
    ax.set_ylabel("std of scores at initialisation")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _outcome_map(results, arms, colors, path):
    """Every cell as a point: x = measured score std at init; y = steps to 99%
    (left) and final eval loss (right)."""
    fig = Figure(figsize=(11, 4.2))
    ax_steps, ax_loss = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    budget = max(r.budget for r in results)
    for r in results:
        label = _label(r.settings, arms)
        std0 = r.at_init("score_std")
        steps = np.array([s if s is not None else np.nan for s in r.steps_to_99()], dtype=float)
        reached = np.isfinite(steps) & np.isfinite(std0)
        ax_steps.scatter(std0[reached], steps[reached], color=colors[label], s=18, alpha=0.8)
        never = ~np.isfinite(steps) & np.isfinite(std0)
        ax_steps.scatter(std0[never], np.full(never.sum(), budget * 1.15), color=colors[label], marker="x", s=22)
        loss = r.final("eval_loss")
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
    fig.suptitle("outcome against score std at initialisation, every run", fontsize=11)
    return save_figure(fig, path)


# ---------------------------------------------------------------------------
def write_report(experiment: Experiment) -> dict[str, Path]:
    """Compute the report of an experiment from its run directories and write
    report.md, report.csv and the figures into the experiment directory."""
    out = experiment.directory
    all_results = collect(experiment)
    if not all_results:
        raise runs.RunError(f"{out}: no runs of this experiment yet; run `python -m attn sweep {experiment.path}` first")
    x, arms, best_of = layout(experiment)
    results = select_best(all_results, best_of)
    references = next((s.get("references") for r in results for s in r.summaries if s.get("references")), {})
    same_task = len({s.get("task") for r in results for s in r.summaries}) == 1
    colors = _arm_colors(results, arms)
    keys = x + arms + ([best_of] if best_of else [])
    rows = table_rows(sorted(results, key=lambda r: tuple(_sort_key(r.settings.get(k)) for k in keys)), keys)
    paths = {"csv": out / "report.csv", "md": out / "report.md"}
    runs.write_atomic(paths["csv"], _csv_text(rows).encode())
    shown_refs = references if same_task else {}
    paths["loss_curves"] = _curves_figure(results, x, arms, colors, "eval_loss", "eval loss (nats)", True, shown_refs,
                                          out / "loss_curves.png", f"{experiment.name}: eval loss, mean ± std over seeds")
    paths["entropy"] = _curves_figure(results, x, arms, colors, "attn_entropy", "attention entropy (nats)", False, {},
                                      out / "entropy.png", f"{experiment.name}: attention entropy of the query rows")
    paths["steps_to_99"] = _steps_figure(results, x, arms, colors, out / "steps_to_99.png")
    paths["score_std_init"] = _score_std_figure(results, x, arms, colors, out / "score_std_init.png")
    paths["outcome_map"] = _outcome_map(all_results, arms + ([best_of] if best_of else []),
                                        _arm_colors(all_results, arms + ([best_of] if best_of else [])), out / "outcome_map.png")
    n_runs = sum(len(r.summaries) for r in all_results)
    text = [f"# {experiment.name}", "", experiment.description.strip(), "",
            f"{n_runs} runs of {len(experiment.cells)} from `{experiment.path}`; x = "
            + ", ".join(f"`{k}`" for k in x) + ", arms = "
            + ", ".join(f"`{a}`" for a in arms) + (f"; each cell at its best `{best_of}`" if best_of else "") + ".",
            "", _markdown_table(rows), "", "## Conclusion (computed from the runs)", ""]
    text += conclusion(results, x, arms)
    ordered = len(x) == 1 and _numeric([x_value(r, x) for r in results])
    checks = expectation_check(results, x, arms[0], references if same_task else {}) if ordered and len(arms) == 1 else []
    if checks:
        text += ["", "## Expectations, tested", ""] + checks
    text += ["", "Figures: " + ", ".join(f"`{p.name}`" for k, p in paths.items() if p.suffix == ".png"), ""]
    runs.write_atomic(paths["md"], "\n".join(text).encode())
    return paths
