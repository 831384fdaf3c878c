"""An experiment report's figures, drawn from its cells (attn.analysis.results) alone.

    headline.png    success rate (Wilson 95%) and Kaplan–Meier median steps to
                    the threshold (95%) against x, per arm, at each arm's best
                    setting (solid) and at the shared one (dashed)
    phase.png       per arm, every best_of value x every x: the dominant
                    outcome class, with the successes k/n; the chosen cell framed
    final_loss.png  every seed's final eval loss at each arm's best setting,
                    with the task's chance and no-retrieval levels
    curves.png      per-seed eval accuracy where a judged cell's seeds split
                    between outcome classes (drawn only if one does)
    mechanism.png   score std at init against theory, saturated rows, the
                    gradient of saturated and other rows (▼ where a median is
                    0, off the log axis), its concentration, and each row's
                    softmax Jacobian against its bound
    loss_curves.png eval loss over training per x, each seed and the median,
                    with the task's chance and no-retrieval levels
    score_growth.png the std of the scores over training, the same way: which
                    arms keep the logits from growing
    lr_sensitivity.png final loss against the rate per x, every arm (with
                    report: sensitivity)

Every figure: one colour per arm (attn.report.experiment_figures, the same in every report), one
legend, axes from the data; an outlier never sets a panel's range (it is
clipped to the bulk of the values and marked); a median curve widens it to be
drawn whole, from step 0 (by at most a decade past the bulk); final_loss and
loss_curves hold the task's chance and no-retrieval levels where every seed
shares them (the plateaus a stalled seed sits on); a log axis holding
few whole powers of ten is labelled in plain numbers
(attn.train.figures.label_log_axis).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from attn import outcomes
from attn.analysis.grouping import canonical
from attn.analysis.results import in_order, mechanism_arrays, median, sort_key
from attn.report.compare_figure import legend_layout, shared_references
from attn.store.runs import series
from attn.text import format_value
from attn.train.figures import draw_references, hold, label_log_axis, mark_zeros, save_figure, wrapped

# One colour per arm value, the same in every report; others take PALETTE in order.
ARM_COLORS = {
    "sqrt": "#1f77b4",
    "none": "#d62728",
    "linear": "#2ca02c",
    "sgd": "#1f77b4",
    "adam": "#9467bd",
    "adamw": "#8c564b",
}
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
OUTCOME_COLORS = {
    outcomes.LEARNED: "#2ca02c",
    outcomes.LEARNED_THEN_LOST: "#ff7f0e",
    outcomes.SLOW: "#bcbd22",
    outcomes.STALLED: "#7f7f7f",
    outcomes.DIVERGED: "#d62728",
}


def arm_colors(arms: list[tuple]) -> dict[tuple, str]:
    """arm -> colour, a different one for each arm: ARM_COLORS by the arm's last
    value where it has one (to the first arm claiming it), else the palette in order."""
    colors, free = {}, [c for c in PALETTE]
    for arm in arms:
        known = ARM_COLORS.get(str(arm[-1])) if arm else None
        if known and known not in colors.values():
            colors[arm] = known
            if known in free:
                free.remove(known)
    for arm in arms:
        if arm not in colors:
            colors[arm] = free.pop(0) if free else PALETTE[len(colors) % len(PALETTE)]
    return colors


LEGEND_ROW_INCHES = 0.22  # the height of one row of a legend at fontsize 8
LEGEND_SHARE = 0.4  # the most of a figure's height its legend takes before the figure grows for it
DODGE_SPAN = 0.36  # series drawn side by side at one x spread over at most this (decades, or categories)
X_MARGIN_DECADES = 0.25  # a log x axis reaches this far beyond the first and last x: room for dodged error bars


def dodged(positions: list, k: int, n: int, log: bool) -> list:
    """Positions shifted for the k-th of n series drawn side by side, so that
    their error bars do not overlap; all n together stay within DODGE_SPAN
    (decades on a log axis, categories otherwise) of their x."""
    offset = (k - (n - 1) / 2) * min(0.06, DODGE_SPAN / max(n - 1, 1))
    return [p * 10**offset if log else p + offset for p in positions]


def x_axis(ax, xs: list[tuple], layout) -> dict:
    """x value -> position: the value on a log axis when every x is one positive number, else categories.
    Labels that would overlap at the panel's width are turned (untangle)."""
    values = [x[0] for x in xs] if all(len(x) == 1 for x in xs) else None
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        ax.set_xscale("log")
        labels = [format_value(v) for v in values]
        ax.set_xticks(values, labels)
        ax.minorticks_off()
        ax.set_xlim(min(values) / 10**X_MARGIN_DECADES, max(values) * 10**X_MARGIN_DECADES)  # from the data
        low, high = (math.log10(v) for v in ax.get_xlim())
        untangle(ax, [(math.log10(v) - low) / (high - low) for v in values], labels)
        return {x: x[0] for x in xs}
    labels = [layout.x_label(x) for x in xs]
    ax.set_xticks(range(len(xs)), labels)
    ax.set_xlim(-0.5, len(xs) - 0.5)
    untangle(ax, [(i + 0.5) / len(xs) for i in range(len(xs))], labels)
    return {x: i for i, x in enumerate(xs)}


TICK_POINTS = 10  # matplotlib's tick label size ("medium")
TURNED_POINTS = 8


def untangle(ax, fractions: list[float], labels: list[str]) -> None:
    """Turn the x tick labels (at these fractions of the panel's width) by
    40 degrees, smaller, when two neighbours would overlap side by side
    (16384 beside 65536 on a narrow panel): a label's width is taken as
    0.6 of its font size per character."""
    width = ax.get_position().width * ax.figure.get_size_inches()[0] * 72  # points
    crowded = any(
        (b - a) * width < 0.6 * TICK_POINTS * (len(left) + len(right)) / 2 + 4
        for a, b, left, right in zip(fractions, fractions[1:], labels, labels[1:])
    )
    if crowded:
        ax.tick_params(axis="x", labelrotation=40, labelsize=TURNED_POINTS)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
            label.set_rotation_mode("anchor")


def bulk_limits(values, log: bool) -> tuple[float, float] | None:
    """(low, high) covering the 5th to 95th percentile of the finite values,
    widened a little: an exploding seed does not set the range."""
    finite = np.asarray([v for v in values if v is not None and np.isfinite(v) and (v > 0 or not log)], dtype=float)
    if not finite.size:
        return None
    low, high = np.percentile(finite, [5, 95]) if finite.size >= 20 else (finite.min(), finite.max())
    if log:
        return low / 1.5, high * 1.5
    pad = 0.05 * (high - low or abs(high) or 1.0)
    return low - pad, high + pad


COVER_REACH = 10.0  # covering: a median widens a log axis by at most this factor past the seeds' bulk


def covering(limits: tuple[float, float] | None, values) -> tuple[float, float] | None:
    """Log-axis `limits` (the bulk of the seeds' values) widened to hold every finite positive value of
    `values` (the median curves, from step 0) a little inside, by at most COVER_REACH each way: a median
    that most seeds' divergence carries to 1e30 does not flatten the other arms."""
    kept = [v for v in values if v is not None and np.isfinite(v) and v > 0]
    if not kept:
        return limits
    low, high = min(kept) / 1.2, max(kept) * 1.2
    if not limits:
        return low, high
    return max(min(low, limits[0]), limits[0] / COVER_REACH), min(max(high, limits[1]), limits[1] * COVER_REACH)


def plateau_levels(seeds) -> dict:
    """The task's plateau levels (chance, no retrieval; attn.tasks) that every seed's run shares, those a log axis
    can show (finite, above 0); {} where the seeds' levels differ."""
    shared = shared_references([s.run for s in seeds])
    return {k: v for k, v in shared.items() if v is not None and math.isfinite(v) and v > 0}


def plateau_lines(ax, levels: dict) -> dict:
    """The plateau levels drawn as in a run's own figures (attn.train.figures.draw_references); label -> line."""
    drawn = len(ax.get_lines())
    draw_references(ax, levels)
    return {line.get_label(): line for line in ax.get_lines()[drawn:]}


def suptitle(fig, text: str, fontsize: float = 9) -> None:
    """The figure's title, wrapped to its width so that it is never cut at either side."""
    fig.suptitle(wrapped(text, fig.get_size_inches()[0], fontsize), fontsize=fontsize)


def wrapped_title(ax, text: str, fontsize: float = 9) -> None:
    """A panel's title, wrapped to the panel's width."""
    ax.set_title(wrapped(text, ax.get_position().width * ax.figure.get_size_inches()[0], fontsize), fontsize=fontsize)


def legend_below(fig, handles, labels, ncol=None) -> None:
    """The figure's one legend, below its panels, and the panels laid out
    above it: at most `ncol` columns (4 by default), fewer where its entries are
    too wide for the figure (wrapped where one is wider than the figure); the
    room left for it grows with its lines, and the figure with them past LEGEND_SHARE."""
    lines = 0
    width, height = fig.get_size_inches()
    if labels:
        texts, columns, lines = legend_layout(list(labels), width, ncol or 4)
        fig.legend(handles, texts, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    room = LEGEND_ROW_INCHES * lines + 0.25 * bool(lines)
    if room > LEGEND_SHARE * height:  # a legend of many lines: the figure grows by it, its panels keep their room
        height += room - LEGEND_SHARE * height
        fig.set_size_inches(width, height)
    with tight_boxes_measured_once(fig):
        fig.tight_layout(rect=(0, room / height, 1, 1))


@contextlib.contextmanager
def tight_boxes_measured_once(fig):
    """While it holds, each axes of `fig` measures its tight box (labels, ticks, title) once per way of asking
    and returns that box again. tight_layout given a rect lays the panels out twice, the second time inside the
    margins of the first, measuring every box again with nothing moved in between: the boxes of the first pass
    serve, and the layout is tight_layout's own (tests/test_figures.py)."""
    axes = fig.get_axes()
    for ax in axes:
        measured = {}

        def measure_once(*args, _measure=ax.get_tightbbox, _measured=measured, **kwargs):
            key = (args, tuple(sorted(kwargs.items())))
            try:
                hash(key)
            except TypeError:  # a way of asking that cannot be remembered (a list of extra artists)
                return _measure(*args, **kwargs)
            if key not in _measured:
                _measured[key] = _measure(*args, **kwargs)
            return _measured[key]

        ax.get_tightbbox = measure_once  # an instance attribute, over the class's method until the finally
    try:
        yield
    finally:
        for ax in axes:
            del ax.get_tightbbox


MIN_PANELS_WIDTH = 7.0  # inches


def panels(n: int, width: float = 3.4, height: float = 2.9):
    """A figure of n panels in rows of up to 4; at least MIN_PANELS_WIDTH wide, so the title and the legend
    below of a one-panel figure leave its axes the height of a row."""
    cols = 3 if n in (5, 6, 9) else min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(max(width * cols, MIN_PANELS_WIDTH), height * rows + 0.6))
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def draw_all(
    experiment, by_key: dict, layout, best: dict, shared: dict, steps: list[int], sensitive: bool, at_lengths: dict
) -> dict:
    """Every figure of the module docstring; by_key: (x, arm) -> the cells
    there (one per best_of value); best, shared: (x, arm) -> the judged cell;
    `sensitive`: draw final loss against the rate, every arm."""
    out = experiment.directory
    colors = arm_colors(in_order(a for _, a in best))
    paths = {
        "headline": headline_figure(best, shared, layout, colors, out / "headline.png", experiment.name),
        "final_loss": final_loss_figure(best, layout, colors, out / "final_loss.png"),
    }
    for name, metric, label in (
        ("loss_curves", "eval_loss", "eval loss (nats)"),
        ("score_growth", "score_std", "std of the scores"),
    ):
        if any(series(s.run.records, metric)[0].size for c in best.values() for s in c.seeds):
            paths[name] = curves_over_training(best, layout, colors, metric, label, out / f"{name}.png")
    if sensitive:
        paths["lr_sensitivity"] = sensitivity_figure(by_key, layout, colors, out / "lr_sensitivity.png")
    if at_lengths:
        paths["lengths"] = lengths_figure(at_lengths, layout, colors, out / "lengths.png")
    if layout.best_of:
        paths["phase"] = phase_figure(by_key, best, layout, out / "phase.png")
    mixed = {key: c for key, c in best.items() if sum(c.count(n) > 0 for n in outcomes.OUTCOMES) > 1}
    if mixed:
        paths["curves"] = curves_figure(mixed, layout, out / "curves.png")
    if steps:
        paths["mechanism"] = mechanism_figure(best, layout, colors, steps, out / "mechanism.png")
    return paths


def headline_figure(best, shared, layout, colors, path, name):
    fig = Figure(figsize=(11, 4.6))
    ax_rate, ax_time = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    xs = in_order(x for x, _ in best)
    budget = max(c.budget for c in best.values())
    handles = {}
    for ax in (ax_rate, ax_time):
        position = x_axis(ax, xs, layout)
    series_drawn = [
        (chosen, style, what, arm)
        for chosen, style, what in ((best, "-", "best"), (shared, "--", "shared"))
        for arm in in_order(a for _, a in chosen)
    ]
    log = ax_rate.get_xscale() == "log"
    for k, (chosen, style, what, arm) in enumerate(series_drawn):
        cells = [(x, c) for x in xs if (c := chosen.get((x, arm))) is not None and c.n]
        if not cells:
            continue
        px = dodged([position[x] for x, _ in cells], k, len(series_drawn), log)
        rates = [c.rate("success") for _, c in cells]
        mid = [r["rate"] for r in rates]
        line = ax_rate.errorbar(
            px,
            mid,
            yerr=[[m - r["low"] for m, r in zip(mid, rates)], [r["high"] - m for m, r in zip(mid, rates)]],
            color=colors[arm],
            linestyle=style,
            marker="o",
            capsize=3,
            alpha=1 if what == "best" else 0.6,
        )
        handles.setdefault(layout.arm_label(arm), line)  # one entry per arm: the title says which line is which
        kms = [c.time() for _, c in cells]
        reached = [(p, km) for p, km in zip(px, kms) if km.median is not None]
        if reached:
            ax_time.errorbar(
                [p for p, _ in reached],
                [km.median for _, km in reached],
                yerr=[
                    [km.median - (km.low if km.low is not None else km.median) for _, km in reached],
                    [(km.high if km.high is not None else budget) - km.median for _, km in reached],
                ],
                color=colors[arm],
                linestyle=style,
                marker="o",
                capsize=3,
                alpha=1 if what == "best" else 0.6,
            )
        never = [p for p, km in zip(px, kms) if km.median is None]
        if never:
            ax_time.scatter(
                never, [budget] * len(never), marker="^", s=60, color=colors[arm], alpha=1 if what == "best" else 0.6
            )
    budget_line = ax_time.axhline(budget, color="0.5", linestyle=":", linewidth=1)
    handles[f"budget: {budget} steps (▲ at it: median not reached)"] = budget_line  # said in the legend, off the data
    ax_rate.set_ylim(-0.03, 1.03)
    ax_rate.set_ylabel(f"seeds that learned (≥ {outcomes.THRESHOLD:.0%}, kept), Wilson 95%")
    ax_time.set_yscale("log")
    label_log_axis(ax_time.yaxis)
    ax_time.set_ylabel(f"median steps to {outcomes.THRESHOLD:.0%} (Kaplan–Meier, 95%)")
    for ax in (ax_rate, ax_time):
        ax.set_xlabel(layout.x_name)
        ax.grid(True, which="major", alpha=0.25)
    suptitle(
        fig,
        f"{name}: "
        + (
            "solid: each arm at its best "
            + layout.names[layout.best_of]
            + (
                f"; dashed: all at {layout.names[layout.best_of]} = {format_value(layout.spec.shared)}"
                if shared
                else ""
            )
            if layout.best_of
            else "success and time to learn"
        ),
        fontsize=10,
    )
    legend_below(fig, list(handles.values()), list(handles))
    return save_figure(fig, path, tight=False)


def phase_figure(by_key, best, layout, path):
    arms = in_order(a for _, a in best)
    fig = Figure(figsize=(4.2 * len(arms) + 0.5, 4.4))
    xs = in_order(x for x, _ in best)
    rates = sorted(
        {
            canonical(c.settings[layout.best_of]): c.settings[layout.best_of]
            for group in by_key.values()
            for c in group
        }.values(),
        key=sort_key,
    )  # by canonical text: a value may be a mapping
    for i, arm in enumerate(arms):
        ax = fig.add_subplot(1, len(arms), i + 1)
        for col, x in enumerate(xs):
            chosen = best.get((x, arm))
            for row, rate in enumerate(rates):
                cell = next((c for c in by_key.get((x, arm), []) if c.settings[layout.best_of] == rate), None)
                if cell is None or not cell.n:
                    ax.add_patch(_box(col, row, "white", "0.85"))
                    ax.text(col, row, "not run", ha="center", va="center", fontsize=6, color="0.5")
                    continue
                ax.add_patch(_box(col, row, OUTCOME_COLORS[cell.dominant()], "white"))
                ax.text(col, row, f"{cell.count(outcomes.LEARNED)}/{cell.n}", ha="center", va="center", fontsize=7)
                if chosen is not None and canonical(cell.settings) == canonical(
                    chosen.settings
                ):  # chosen: a copy on its seeds
                    ax.add_patch(_box(col, row, "none", "black", width=2.0)).set_zorder(
                        3
                    )  # above the cells drawn after it
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set_ylim(-0.5, len(rates) - 0.5)
        ax.set_xticks(range(len(xs)), [layout.x_label(x) for x in xs], fontsize=7)
        ax.set_yticks(range(len(rates)), [format_value(r) for r in rates], fontsize=7)
        ax.set_xlabel(layout.x_name)
        ax.set_ylabel(layout.names[layout.best_of])
        ax.set_title(layout.arm_label(arm), fontsize=9)
    from matplotlib.patches import Patch

    handles = [Patch(color=OUTCOME_COLORS[n]) for n in outcomes.OUTCOMES]
    suptitle(
        fig, "dominant outcome of each cell (text: seeds that learned / seeds); framed: the rate chosen", fontsize=9
    )
    legend_below(fig, handles, list(outcomes.OUTCOMES), ncol=5)
    return save_figure(fig, path, tight=False)


def _box(col, row, face, edge, width=0.8):
    from matplotlib.patches import Rectangle

    return Rectangle((col - 0.5, row - 0.5), 1, 1, facecolor=face, edgecolor=edge, linewidth=width)


DIVERGED_MARK = "diverged (drawn at the top)"


def final_loss_figure(best, layout, colors, path):
    fig = Figure(figsize=(7.5, 4.4))
    ax = fig.add_subplot()
    xs, arms = in_order(x for x, _ in best), in_order(a for _, a in best)
    position = x_axis(ax, xs, layout)
    log_x = ax.get_xscale() == "log"
    values = [v for c in best.values() for v in c.final_losses() if math.isfinite(v)]
    references = plateau_levels([s for c in best.values() for s in c.seeds])
    limits = hold(bulk_limits(values, log=True), references.values(), log=True)  # the plateaus inside the axes
    rng = np.random.default_rng(0)  # the jitter only
    handles, marks = {}, {}
    plateaus = plateau_lines(ax, references)
    top = limits[1] if limits else 1.0
    for k, arm in enumerate(arms):
        offset = (k - (len(arms) - 1) / 2) * 0.18
        for x in xs:
            cell = best.get((x, arm))
            if cell is None or not cell.n:
                continue
            base = position[x] * (10 ** (offset * 0.25)) if log_x else position[x] + offset
            losses = np.array(cell.final_losses())
            finite = np.isfinite(losses)
            jitter = (10 ** (rng.uniform(-0.03, 0.03, len(losses)))) if log_x else rng.uniform(-0.05, 0.05, len(losses))
            px = base * jitter if log_x else base + jitter
            if finite.any():  # a cell whose every seed diverged has only its crosses at the top
                shown = np.clip(losses[finite], *(limits or (losses[finite].min(), losses[finite].max())))
                handles[layout.arm_label(arm)] = ax.scatter(px[finite], shown, color=colors[arm], s=14, alpha=0.8)
            clipped = finite & ((losses > top) | (limits is not None and (losses < limits[0])))
            if clipped.any():
                ax.scatter(
                    px[clipped],
                    np.clip(losses[clipped], *limits),
                    marker="s",
                    facecolors="none",
                    edgecolors=colors[arm],
                    s=30,
                )
            if (~finite).any():  # in its arm's colour; the legend's × in grey, after the arms, stands for any arm's
                ax.scatter(px[~finite], [top] * (~finite).sum(), marker="x", color=colors[arm], s=36)
                marks[DIVERGED_MARK] = Line2D([], [], marker="x", color="0.3", linestyle="none")
    if limits:
        ax.set_ylim(limits[0], top * 1.2)
    ax.set_yscale("log")
    label_log_axis(ax.yaxis)
    ax.set_xlabel(layout.x_name)
    ax.set_ylabel("final eval loss (nats), one point per seed")
    ax.grid(True, which="major", alpha=0.25)
    wrapped_title(
        ax, "final loss of every seed at each arm's best setting (□: outside the bulk, drawn at the axis's edge)"
    )
    handles.update(marks | plateaus)  # after the arms
    legend_below(fig, list(handles.values()), list(handles))
    return save_figure(fig, path, tight=False)


def curves_figure(mixed, layout, path):
    fig, axes = panels(len(mixed))
    for ax, ((x, arm), cell) in zip(axes, mixed.items()):
        for seed in cell.seeds:
            steps, acc = series(seed.run.records, "eval_accuracy")
            ax.plot(steps, acc, color=OUTCOME_COLORS[seed.outcome.outcome], linewidth=1, alpha=0.8)
        ax.axhline(outcomes.THRESHOLD, color="0.4", linestyle=":", linewidth=0.8)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{layout.arm_label(arm)}, {layout.x_name} = {layout.x_label(x)}", fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylabel("eval accuracy")
        ax.grid(True, alpha=0.25)
    present = [n for n in outcomes.OUTCOMES if any(c.count(n) for c in mixed.values())]
    suptitle(fig, "cells whose seeds split between outcomes: every seed, coloured by its outcome", fontsize=9)
    legend_below(fig, [Line2D([], [], color=OUTCOME_COLORS[n]) for n in present], present, ncol=len(present))
    return save_figure(fig, path, tight=False)


ZERO_MEDIAN = "a median of 0, off the log axis: at least half of those rows pass a gradient of exactly 0"


def mechanism_figure(best, layout, colors, steps, path):
    """The mechanism at each arm's best setting against x: score std, saturated rows, the rows' gradients and
    their concentration at two steps, each arm's markers beside the others' at each x; and every row's softmax
    Jacobian under its bound."""
    fig, axes = panels(6, width=3.6, height=3.0)
    xs, arms = in_order(x for x, _ in best), in_order(a for _, a in best)
    first, later = steps[0], steps[-1]
    handles = {}
    panel_specs = [
        ("score std at step 0 (dashed: theory √d_k·s·g²)", None, "log"),
        (f"saturated rows (max p > 0.99): step {first} ●, {later} ○", "saturated_frac", "linear"),
        (f"median ‖∇W_q‖ of a row at step {first}: saturated ×, other ●", "grad_W_q", "log"),
        (f"median ‖∇W_k‖ of a row at step {first}: saturated ×, other ●", "grad_W_k", "log"),
        (f"share of Σ‖∇W_q‖² in the top 10% of rows: {first} ●, {later} ○", "grad_W_q_top_share", "linear"),
    ]
    for ax, (title, key, yscale) in zip(axes, panel_specs):
        position = x_axis(ax, xs, layout)
        log = ax.get_xscale() == "log"
        drawn, zeros = [], 0
        for k, arm in enumerate(arms):
            cells = [(position[x], c) for x in xs if (c := best.get((x, arm))) is not None and c.n]
            px = dodged([p for p, _ in cells], k, len(arms), log)  # arms that start alike would hide each other
            if key is None:
                handles[layout.arm_label(arm)] = ax.plot(
                    px, [median(c.at_init("score_std")) for _, c in cells], "o-", color=colors[arm]
                )[0]
                ax.plot(px, [c.theory_score_std for _, c in cells], "--", color=colors[arm], linewidth=1)
                continue
            if key in ("grad_W_q", "grad_W_k"):
                lines = [
                    ([median(c.mechanism(first, f"{key}_median_other")) for _, c in cells], "o-", {}),
                    ([median(c.mechanism(first, f"{key}_median_saturated")) for _, c in cells], "x--", {}),
                ]
            else:
                lines = [
                    ([median(c.mechanism(first, key)) for _, c in cells], "o-", {}),
                    ([median(c.mechanism(later, key)) for _, c in cells], "o--", {"markerfacecolor": "none"}),
                ]
            for values, style, extra in lines:
                values = np.asarray(values, dtype=float)
                off = (values <= 0) if yscale == "log" else np.zeros(len(values), dtype=bool)  # NaN: False
                ax.plot(px, np.where(off, np.nan, values), style, color=colors[arm], **extra)
                drawn += [v for v in values[~off] if np.isfinite(v)]
                if off.any():  # a median of 0 has no place on a log axis: a ▼ at its foot, and a word
                    zeros += 1
                    mark_zeros(ax, np.asarray(px)[off], colors[arm])
        empty = key is not None and not drawn
        ax.set_yscale("linear" if empty else yscale)
        if empty:  # an empty panel says why, with no y values to read
            ax.text(
                0.5,
                0.5,
                "no finite value in the runs drawn\n(as in qk_norm runs made before\n"
                "the gradient was measured\nthrough the norm)",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=8,
                color="0.4",
            )
            ax.set_yticks([])
        elif zeros:  # said once, in the legend
            handles[ZERO_MEDIAN] = ax.plot([], [], "v", color="0.3")[0]
        if not empty and yscale == "log":
            label_log_axis(ax.yaxis)
        ax.set_title(title, fontsize=7.5)
        ax.set_xlabel(layout.x_name, fontsize=8)
        ax.grid(True, which="major", alpha=0.25)
    ax = axes[-1]
    for arm in arms:
        rows = [
            r
            for (x, a), c in best.items()
            if a == arm
            for s in c.seeds
            for step, r in mechanism_arrays(s.run).items()
            if step == first
        ]
        jacobian = np.concatenate([r["jacobian"] for r in rows]) if rows else np.array([])
        bound = np.concatenate([r["bound"] for r in rows]) if rows else np.array([])
        ax.scatter(bound, jacobian, s=4, alpha=0.3, color=colors[arm])
    ax.plot([0, 2], [0, 2], color="0.3", linewidth=0.8, linestyle=":")
    ax.set_xlabel("2 (1 − max p): the bound", fontsize=8)
    ax.set_ylabel("‖J‖₂ of the row's softmax", fontsize=8)
    ax.set_title(f"every row at step {first}, all x: the Jacobian under its bound", fontsize=7.5)
    ax.grid(True, alpha=0.25)
    suptitle(
        fig,
        f"score std, saturated rows and per-row gradients at steps {first} and {later}, measured on the eval set's "
        "query rows at each arm's best setting (median over seeds)",
        fontsize=9,
    )
    legend_below(fig, list(handles.values()), list(handles), ncol=min(len(handles), 3))
    return save_figure(fig, path, tight=False)


def curves_over_training(best, layout, colors, metric, ylabel, path):
    """A metric over training at each arm's best setting: every seed (thin) and the median (thick), a panel per x."""
    xs, arms = in_order(x for x, _ in best), in_order(a for _, a in best)
    fig, axes = panels(len(xs))
    handles, plateaus = {}, {}
    for ax, x in zip(axes, xs):
        values, medians, starts = [], [], []  # starts: each median at its first step, never off the axis
        references = {}
        if "loss" in metric:  # where a seed that learns nothing sits
            references = plateau_levels([s for arm in arms if (x, arm) in best for s in best[(x, arm)].seeds])
            plateaus.update(plateau_lines(ax, references))
        for arm in arms:
            cell = best.get((x, arm))
            if cell is None or not cell.n:
                continue
            curves = [series(s.run.records, metric) for s in cell.seeds]
            curves = [(steps, v) for steps, v in curves if len(steps)]
            if not curves:
                continue
            for steps, v in curves:
                ax.plot(steps, v, color=colors[arm], linewidth=0.6, alpha=0.35)
                values += list(v)
            longest = max(curves, key=lambda c: len(c[0]))[0]
            median = [np.median([v[steps == s][0] for steps, v in curves if (steps == s).any()]) for s in longest]
            handles[layout.arm_label(arm)] = ax.plot(longest, median, color=colors[arm], linewidth=1.8)[0]
            medians += median
            starts.append(median[0])
        # the seeds' bulk, and each median to a decade past it
        limits = covering(bulk_limits(values, log=True), medians)
        limits = hold(limits, [*references.values(), *starts], log=True)  # and the plateau levels and step 0
        if limits:
            ax.set_ylim(*limits)
        ax.set_yscale("log")
        label_log_axis(ax.yaxis)
        ax.set_title(f"{layout.x_name} = {layout.x_label(x)}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.25)
    suptitle(
        fig,
        f"{ylabel} at each arm's best setting: every seed (thin) and the median (thick); "
        "y range from the bulk of the seeds, holding each median from step 0 (to a decade past the bulk)",
        fontsize=9,
    )
    handles.update(plateaus)  # after the arms
    legend_below(fig, list(handles.values()), list(handles))
    return save_figure(fig, path, tight=False)


def sensitivity_figure(by_key, layout, colors, path):
    """Final eval loss against the rate (median over seeds, a seed's divergence at its loss at init), a panel per x."""
    xs = in_order(x for x, _ in by_key)
    arms = in_order(a for _, a in by_key)
    fig, axes = panels(len(xs), width=3.8, height=3.2)
    handles = {}
    for ax, x in zip(axes, xs):
        initial = []
        for arm in arms:
            cells = sorted(by_key.get((x, arm), []), key=lambda c: sort_key(c.settings[layout.best_of]))
            rates, medians = [], []
            for cell in cells:
                init = [v for v in cell.at_init("eval_loss")]
                initial += init
                if cell.n and init:
                    rates.append(cell.settings[layout.best_of])
                    medians.append(float(np.median([min(loss, max(init)) for loss in cell.final_losses()])))
            if rates:
                handles[layout.arm_label(arm)] = ax.plot(rates, medians, "o-", color=colors[arm], markersize=3)[0]
        if initial:
            ax.axhline(float(np.median(initial)), color="0.4", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{layout.x_name} = {layout.x_label(x)}  (dotted: loss at init)", fontsize=8)
        ax.set_xlabel(layout.names[layout.best_of])
        ax.set_ylabel("final eval loss (median over seeds)")
        ax.grid(True, which="major", alpha=0.25)
    suptitle(
        fig,
        "learning-rate sensitivity: final loss against the rate, every arm (a diverged or worse seed "
        "counts as its loss at init)",
        fontsize=9,
    )
    legend_below(fig, list(handles.values()), list(handles), ncol=min(len(handles), 5))
    return save_figure(fig, path, tight=False)


def lengths_figure(at_lengths: dict, layout, colors, path):
    """Attention on the queried key and accuracy against the number of pairs, per arm (median and range over seeds)."""
    xs = in_order(x for x, _ in at_lengths)
    fig = Figure(figsize=(4.0 * len(xs), 6.2))
    handles = {}
    for col, x in enumerate(xs):
        for row, (name, label) in enumerate(
            (("target_attn", "attention on the queried key"), ("accuracy", "accuracy"))
        ):
            ax = fig.add_subplot(2, len(xs), row * len(xs) + col + 1)
            for (cx, arm), by_length in at_lengths.items():
                if cx != x or not by_length:
                    continue
                pairs = sorted(by_length)
                values = [np.asarray(by_length[P][name], dtype=float) for P in pairs]
                handles[layout.arm_label(arm)] = ax.plot(
                    pairs, [np.median(v) for v in values], "o-", color=colors[arm]
                )[0]
                ax.fill_between(
                    pairs, [v.min() for v in values], [v.max() for v in values], color=colors[arm], alpha=0.15
                )
            ax.set_xscale("log")
            ax.set_xticks(
                sorted({P for by in at_lengths.values() for P in by}),
                [str(P) for P in sorted({P for by in at_lengths.values() for P in by})],
            )
            ax.minorticks_off()
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("pairs in the context")
            ax.set_ylabel(label)
            ax.set_title(f"{layout.x_name} = {layout.x_label(x)}", fontsize=9)
            ax.grid(True, alpha=0.25)
    suptitle(fig, "trained on one length, asked about longer ones: median over seeds, band: their range", fontsize=9)
    legend_below(fig, list(handles.values()), list(handles))
    return save_figure(fig, path, tight=False)
