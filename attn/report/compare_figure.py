"""The comparison's figure: one panel per metric, a row of panels per facet value, each
group's mean with its ± std band (attn.analysis.curves); references and the threshold drawn.

Axes. --xlim LOW,HIGH fixes the x range of every panel (runs of very
different lengths on one axis), and the y range follows what is drawn in it,
always holding each curve's first point (step 0) and the reference lines:
its bulk (attn.store.runs.robust_limits: a diverged run's tail, and the groups
whose every run diverged, do not set it; a × marks where such a run ended,
held to the axis edge with its value when off it), or every finite value
drawn with robust=False (`attn compare --all-y`, the board's "all y values").
--yscale auto (log_scale) draws losses, gradient norms and update ratios on a
log axis; a log axis of few decades is labelled in plain numbers
(attn.train.figures.label_log_axis).
A long legend goes below the panels, in as many columns as fit the figure's
width, its labels wrapped to fit, and the figure grows to hold it.

The n beside a group's label in the legend is the number of runs averaged
at its last step drawn (of the first panel's metric; within --xlim), not
how many runs it has.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
from matplotlib.figure import Figure

from attn.analysis.curves import Band, group_curve, place_steps, run_curve, view_unit
from attn.analysis.grouping import THRESHOLD_METRIC, Group, Run, canonical, varying_keys
from attn.store.runs import robust_limits
from attn.train import figures

DEFAULT_METRICS = ("eval_loss", "eval_accuracy")
X_AXES = {"step": "step", "wall_time": "wall time (s)"}
LINESTYLES = ("-", "--", "-.", ":")
WIDE_RANGE = 1e3  # --yscale auto: a positive metric whose values span more than this factor gets a log axis


def shared_references(loaded: list[Run]) -> dict:
    """The reference losses (chance, no retrieval) if every run has the same ones, else {}."""
    found = {canonical(run.summary.get("references") or {}) for run in loaded}
    return json.loads(found.pop()) if len(found) == 1 else {}


def _limits(arrays: list, log: bool, robust: bool = True) -> tuple[float, float] | None:
    """y limits from the bulk of the drawn values (attn.store.runs.robust_limits)."""
    return robust_limits(arrays, log, robust)


LEGEND_FONT_POINTS = 8


CHAR_INCHES = 0.55 * LEGEND_FONT_POINTS / 72  # the width of a legend character, about


HANDLE_INCHES = 0.7  # a legend entry's line sample and padding


LINE_INCHES = 1.6 * LEGEND_FONT_POINTS / 72  # a legend line's height


def last_counts(
    groups: list[Group], metric: str, x: str = "step", smoothing: float = 0.0, xlim: tuple[float, float] | None = None
) -> list[int]:
    """Per group, the number of runs averaged at its last point drawn (within xlim) of `metric`."""
    counts = []
    for group in groups:
        xs, band = group_curve(group, metric, x, smoothing, view_unit(groups, metric) if smoothing else None)
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
            note = (
                "n="
                + ", ".join(str(n) if n == total else f"{n} of {total}" for n, total in found)
                + " at the last step, by row"
            )
        texts[text] = f"{text or 'all runs'}  ({note})"
    return texts


def legend_layout(texts: list[str], width: float, most: int | None = None) -> tuple[list[str], int, int]:
    """(the texts wrapped to fit the figure's width, columns, lines of text):
    as many columns as the widest entry allows, and at most `most`."""
    chars = max(10, int((width - HANDLE_INCHES) / CHAR_INCHES))
    wrapped = [textwrap.fill(text, chars) for text in texts]
    widest = max(max(len(line) for line in text.split("\n")) for text in wrapped) * CHAR_INCHES + HANDLE_INCHES
    columns = max(1, min(len(wrapped), int(width // widest), len(wrapped) if most is None else most))
    rows = [wrapped[i : i + columns] for i in range(0, len(wrapped), columns)]
    return wrapped, columns, sum(max(text.count("\n") + 1 for text in row) for row in rows)


# --yscale auto (and the board's y scale auto): a metric whose name holds one of these is drawn on a log axis
LOG_METRICS = ("loss", "grad_norm", "update_ratio")


def log_scale(metric: str, bands: list[Band], yscale: str = "auto") -> bool:
    """yscale auto: log for loss metrics, gradient norms and update ratios
    (which fall by orders of magnitude as rows saturate), and for positive
    values spanning more than WIDE_RANGE."""
    if yscale != "auto":
        return yscale == "log"
    if any(word in metric for word in LOG_METRICS):
        return True
    values = np.concatenate([np.concatenate([b.low, b.high]) for b in bands]) if bands else np.array([])
    return len(values) > 0 and values.min() > 0 and values.max() > WIDE_RANGE * values.min()


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


def draw_comparison(
    groups: list[Group],
    metrics=DEFAULT_METRICS,
    x: str = "step",
    smoothing: float = 0.0,
    yscale: str = "auto",
    references: dict | None = None,
    threshold: float | None = None,
    title: str = "",
    xlim: tuple[float, float] | None = None,
    facet: str | None = None,
    robust: bool = True,
) -> Figure:
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
            _draw_panel(
                ax,
                [groups[k] for k in shown],
                [styles[k] for k in shown],
                [texts[groups[k].label] for k in shown],
                metric,
                x,
                smoothing,
                yscale,
                references if "loss" in metric else None,
                threshold if metric == THRESHOLD_METRIC else None,
                xlim,
                value,
                view_unit(groups, metric) if smoothing else None,
                robust,
            )
    handles = {}
    for ax in fig.axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    group_texts = set(texts.values())
    order = sorted(handles, key=lambda text: text not in group_texts)
    wrapped, columns, lines = legend_layout(order, width)
    fig.legend(
        [handles[text] for text in order],
        wrapped,
        loc="outside lower center",
        ncol=columns,
        fontsize=LEGEND_FONT_POINTS,
    )
    fig.set_size_inches(width, 4.4 * len(rows) + lines * LINE_INCHES + 0.5)
    if title:
        fig.suptitle(textwrap.fill(title, int(width / (CHAR_INCHES * 10 / LEGEND_FONT_POINTS))), fontsize=10)
    return fig


def _draw_panel(
    ax,
    groups: list[Group],
    styles: list[dict],
    texts: list[str],
    metric: str,
    x: str,
    smoothing: float,
    yscale: str,
    references: dict | None,
    threshold: float | None,
    xlim: tuple[float, float] | None,
    facet: str,
    unit: float | None = None,
    robust: bool = True,
) -> None:
    curves = [group_curve(group, metric, x, smoothing, unit) for group in groups]
    raws = [group_curve(group, metric, x) for group in groups] if smoothing else [None] * len(groups)
    log = log_scale(metric, [band for _, band in curves], yscale)
    if log:
        ax.set_yscale("log", nonpositive="clip")
    extents = [[0.0, 1.0]] if "accuracy" in metric and not log else []
    tails = []  # values of groups whose every run diverged: they set the range only if nothing else is drawn
    held = []  # what the range always holds: each group's first value drawn (step 0) and the reference lines
    crosses = []  # (x, y, colour) of each diverged run's last finite value
    alpha = 0.18 if len(groups) <= 4 else 0.1
    for group, style, text, (xs, band), raw in zip(groups, styles, texts, curves, raws):
        if raw is not None:  # the raw curve, faint behind the smoothed one
            ax.plot(raw[0], raw[1].mean, linewidth=0.8, alpha=0.3, color=style["color"], linestyle=style["linestyle"])
        ax.plot(xs, band.mean, linewidth=1.5, label=text, **style)
        spread = np.isfinite(band.std)
        drawn = (xs >= xlim[0]) & (xs <= xlim[1]) if xlim else np.ones(len(xs), dtype=bool)  # what sets the y range
        into = tails if group.runs and all(r.status == "diverged" for r in group.runs) else extents
        into.append(band.mean[drawn])
        held += list(band.mean[drawn & np.isfinite(band.mean)][:1])
        if spread.any():
            lower, upper = band.edges()
            into += [lower[spread & drawn], upper[spread & drawn]]
            ax.fill_between(xs, lower, upper, where=spread, color=style["color"], alpha=alpha, linewidth=0)
        for run in (r for r in group.runs if r.status == "diverged"):
            steps, values = run_curve(run, metric, smoothing, unit)
            run_xs, placed = place_steps(steps, [run], x)
            if len(placed):
                crosses.append((run_xs[-1], values[placed[-1]], style["color"]))
    if references:
        figures.draw_references(ax, references)
        held += [v for v in references.values() if v is not None]
    if threshold is not None:
        ax.axhline(threshold, color="0.3", linestyle="-.", linewidth=0.8, label=f"threshold {threshold:g}")
    limits = _limits(extents if any(len(e) for e in extents) and robust else extents + tails, log, robust)
    limits = figures.hold(limits, held, log)
    if limits:
        ax.set_ylim(*limits)
    if log:
        figures.label_log_axis(ax.yaxis)
    for cross_x, cross_y, colour in crosses:
        ax.plot(
            cross_x,
            cross_y if not limits else min(max(cross_y, limits[0]), limits[1]),
            marker="x",
            markersize=7,
            linestyle="none",
            color=colour,
            label="diverged run (last finite value)",
            clip_on=False,
        )
        if limits and not limits[0] <= cross_y <= limits[1]:  # off the axis: the × at its edge, with its value
            ax.annotate(
                f"{cross_y:.2g}",
                (cross_x, min(max(cross_y, limits[0]), limits[1])),
                xytext=(4, -10 if cross_y > limits[1] else 4),
                textcoords="offset points",
                fontsize=7,
                color=colour,
            )
    if xlim:
        ax.set_xlim(*xlim)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(metric)
    ax.set_title(
        metric
        + (f"  (EMA {smoothing:g} by step, raw faint)" if smoothing else "")
        + (f"  —  {facet}" if facet else ""),
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
