"""The report figures' common ground: one colour per arm (the same in every
report) and per outcome class, x axes and their dodged series, y ranges
from the bulk of the values, and the one legend below the panels.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from attn import outcomes
from attn.grouping import format_value

# One colour per arm value, the same in every report; others take PALETTE in order.
ARM_COLORS = {"sqrt": "#1f77b4", "none": "#d62728", "linear": "#2ca02c", "sgd": "#1f77b4", "adam": "#9467bd",
              "adamw": "#8c564b"}
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f")
OUTCOME_COLORS = {outcomes.LEARNED: "#2ca02c", outcomes.LEARNED_THEN_LOST: "#ff7f0e", outcomes.SLOW: "#bcbd22",
                  outcomes.STALLED: "#7f7f7f", outcomes.DIVERGED: "#d62728"}


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
DODGE_SPAN = 0.36  # series drawn side by side at one x spread over at most this (decades, or categories)
X_MARGIN_DECADES = 0.25  # a log x axis reaches this far beyond the first and last x: room for dodged error bars


def dodged(positions: list, k: int, n: int, log: bool) -> list:
    """Positions shifted for the k-th of n series drawn side by side, so that
    their error bars do not overlap; all n together stay within DODGE_SPAN
    (decades on a log axis, categories otherwise) of their x."""
    offset = (k - (n - 1) / 2) * min(0.06, DODGE_SPAN / max(n - 1, 1))
    return [p * 10 ** offset if log else p + offset for p in positions]


def x_axis(ax, xs: list[tuple], layout) -> dict:
    """x value -> position: the value on a log axis when every x is one positive number, else categories."""
    values = [x[0] for x in xs] if all(len(x) == 1 for x in xs) else None
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        ax.set_xscale("log")
        ax.set_xticks(values, [format_value(v) for v in values])
        ax.minorticks_off()
        ax.set_xlim(min(values) / 10 ** X_MARGIN_DECADES, max(values) * 10 ** X_MARGIN_DECADES)  # from the data
        return {x: x[0] for x in xs}
    ax.set_xticks(range(len(xs)), [layout.x_label(x) for x in xs])
    ax.set_xlim(-0.5, len(xs) - 0.5)
    return {x: i for i, x in enumerate(xs)}


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


def legend_below(fig, handles, labels, ncol=None) -> None:
    """The figure's one legend, below its panels, and the panels laid out
    above it: the room left for it grows with its rows."""
    rows = 0
    if labels:
        ncol = ncol or min(len(labels), 4)
        rows = math.ceil(len(labels) / ncol)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, min(0.4, (LEGEND_ROW_INCHES * rows + 0.25 * bool(rows)) / height), 1, 1))


def panels(n: int, width: float = 3.4, height: float = 2.9):
    cols = 3 if n in (5, 6, 9) else min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.6))
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]
