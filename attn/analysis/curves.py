"""A group's curve of a metric: each run's values smoothed, then their mean ± std at each step.

    xs, band = group_curve(group, "eval_loss", x="step", smoothing=0.6)
    lower, upper = band.edges()      # the band drawn

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

Smoothing (optional) is applied to each run before the band statistics: a
time-weighted, bias-corrected exponential moving average, by step rather
than by logged point (so runs logged at different rates are smoothed over
the same window of steps). With the logged steps s_1 < s_2 < ... and a unit
u (in steps, smoothing_unit: the median gap between logged steps of the
most finely logged curve drawn), each point decays what came before by
d_t = β^((s_t - s_{t-1})/u) and weighs 1 - d_t itself (the first 1 - β), so a
point standing for a longer stretch of steps counts for more:

    m_t = d_t m_{t-1} + (1 - d_t) y_t,   w_t = d_t w_{t-1} + (1 - d_t),   ŷ_t = m_t / w_t

For evenly logged points (s_t - s_i = (t - i) u) this is the bias-corrected
EMA m_t = β m_{t-1} + (1 - β) y_t, ŷ_t = m_t / (1 - β^t) (Adam's bias
correction, as TensorBoard's debiased smoothing): early points are a weighted
mean of what was seen so far, not pulled toward 0.

Axes: attn.store.runs.robust_limits (a run's own figures use it too).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from attn.analysis.grouping import Group, Run
from attn.store import runs


def ema(values: np.ndarray, smoothing: float, steps: np.ndarray | None = None, unit: float | None = None) -> np.ndarray:
    """Time-weighted bias-corrected EMA (module docstring); smoothing = β in [0, 1).
    Without steps (or unit), each logged point is one unit apart."""
    values = np.asarray(values, dtype=float)
    smoothed = np.empty(len(values))
    if not len(values):
        return smoothed
    if steps is None:
        gaps = np.ones(len(values))
    else:
        steps = np.asarray(steps, dtype=float)
        gaps = np.diff(steps, prepend=steps[0]) / (unit or smoothing_unit([steps]))
    numerator = denominator = 0.0
    for t, (y, gap) in enumerate(zip(values, gaps)):
        decay = smoothing**gap if t else smoothing
        numerator = decay * numerator + (1.0 - decay) * y
        denominator = decay * denominator + (1.0 - decay)
        smoothed[t] = numerator / denominator
    return smoothed


def smoothing_unit(step_arrays: list) -> float:
    """The smoothing's unit in steps: the smallest median gap between logged
    steps over the curves drawn (1 if none has two points)."""
    gaps = [float(np.median(np.diff(np.asarray(s, dtype=float)))) for s in step_arrays if len(s) >= 2]
    gaps = [g for g in gaps if g > 0]
    return min(gaps) if gaps else 1.0


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
    steps = (
        np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s, _ in curves]))
        if curves
        else np.array([], np.int64)
    )
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


def run_curve(
    run: Run, metric: str, smoothing: float = 0.0, unit: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one run's metric, non-finite values dropped, then
    smoothed by step (unit: smoothing_unit of the curves drawn; default this run's)."""
    steps, values = runs.series(run.records, metric)
    return steps, (ema(values, smoothing, steps, unit) if smoothing else values.astype(float))


def view_unit(groups: list[Group], metric: str) -> float:
    """smoothing_unit over every run of the groups drawn (one unit for a whole view)."""
    return smoothing_unit([runs.series(run.records, metric)[0] for g in groups for run in g.runs])


def place_steps(steps: np.ndarray, members: list[Run], x: str) -> tuple[np.ndarray, np.ndarray]:
    """(x coordinates, index into steps) of the steps that have an x coordinate."""
    if x == "step":
        return steps.astype(float), np.arange(len(steps))
    clock = band_stats([runs.series(run.records, x) for run in members])
    _, at_steps, at_clock = np.intersect1d(steps, clock.steps, return_indices=True)
    return clock.mean[at_clock], at_steps


def group_curve(
    group: Group, metric: str, x: str = "step", smoothing: float = 0.0, unit: float | None = None
) -> tuple[np.ndarray, Band]:
    """(x coordinates, band) of a group's metric; x is the step or the mean wall time at each step.
    unit: the smoothing's (smoothing_unit); default the group's."""
    if smoothing and unit is None:
        unit = smoothing_unit([runs.series(run.records, metric)[0] for run in group.runs])
    band = band_stats([run_curve(run, metric, smoothing, unit) for run in group.runs])
    xs, index = place_steps(band.steps, group.runs, x)
    return xs, band.take(index)
