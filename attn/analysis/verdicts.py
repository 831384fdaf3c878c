"""Where an experiment's cells are judged, and each expectation's verdict.

Layout (report_spec.ReportSpec): cells are placed along `x` and compared
between `arm`s; with `best_of`, each (x, arm) is judged at the value of
best_of that the declared `select` rule picks (attn.analysis.stats.select over
attn.analysis.results.CellResult.selection_figures), and also at the `shared` value when
the file names one: each arm at its own best setting, and all at one.

An expectation's verdict, at each x it covers (intervals are 95%): for
`better_than`, confirmed when the two arms' intervals are separated the
claimed way, not confirmed when separated the other way, inconclusive when
they overlap; for `above`/`below`, confirmed when the interval lies wholly
on the claimed side of the number, not confirmed when wholly on the other,
inconclusive across it. Over its x values: confirmed if every one is, not
confirmed if any is, else inconclusive. A median time not reached within
the budget counts as +inf, an unbounded interval end as 0 or +inf.
"""

from __future__ import annotations

import math

from attn.analysis import stats
from attn.analysis.grouping import format_value, short_names
from attn.analysis.results import CellResult, sort_key
from attn.experiment.report_spec import STATS, Expectation
from attn.experiment.spec import Experiment

CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE = "confirmed", "not confirmed", "inconclusive"


# ---------------------------------------------------------------------------
# Layout: where a cell sits, which cells are judged
# ---------------------------------------------------------------------------
class Layout:
    """The report's view of the grid: x, arm and best_of keys, short names."""

    def __init__(self, experiment: Experiment):
        spec = experiment.report
        self.spec = spec
        self.x, self.arm, self.best_of = list(spec.x), list(spec.arm), spec.best_of
        self.names = short_names(list(experiment.grid_keys))

    def x_of(self, cell: CellResult) -> tuple:
        return tuple(value_of(cell.settings.get(k)) for k in self.x)

    def arm_of(self, cell: CellResult) -> tuple:
        return tuple(value_of(cell.settings.get(k)) for k in self.arm)

    def label(self, values: tuple, keys: list[str]) -> str:
        """'scale=none, d_k=256': the keys' values, those a cell's grid block does not set (None) left out."""
        return ", ".join(f"{self.names[k]}={format_value(v)}" for k, v in zip(keys, values) if v is not None) \
            or "all runs"

    def arm_label(self, arm: tuple) -> str:
        return self.label(arm, self.arm)

    def x_label(self, x: tuple) -> str:
        return " / ".join(format_value(v) for v in x)

    @property
    def x_name(self) -> str:
        return " / ".join(self.names[k] for k in self.x)


def value_of(value):
    """A setting as a comparable, hashable value (a mapping or list as its text)."""
    return format_value(value) if isinstance(value, (dict, list)) else value


def groups(cells: list[CellResult], layout: Layout) -> dict[tuple, list[CellResult]]:
    """(x, arm) -> its cells (one per value of best_of, or just one)."""
    out: dict[tuple, list[CellResult]] = {}
    for cell in cells:
        out.setdefault((layout.x_of(cell), layout.arm_of(cell)), []).append(cell)
    return dict(sorted(out.items(), key=lambda item: ([sort_key(v) for v in item[0][1]],
                                                      [sort_key(v) for v in item[0][0]])))


def select_cell(cells: list[CellResult], criteria) -> CellResult:
    """The cell the declared rule picks (attn.analysis.stats.select; ties: the first)."""
    return cells[stats.select([c.selection_figures() for c in cells], list(criteria))]


def judged_cells(cells: list[CellResult], layout: Layout, at: str) -> dict[tuple, CellResult]:
    """(x, arm) -> the cell judged there: the selected one (`best`), the one
    at the shared value (`shared`), or the only one (no best_of)."""
    chosen = {}
    for key, group in groups(cells, layout).items():
        if layout.best_of is None:
            chosen[key] = group[0]
        elif at == "best":
            in_rate_order = sorted(group, key=lambda c: sort_key(c.settings[layout.best_of]))
            chosen[key] = select_cell(in_rate_order, layout.spec.select)
        else:
            shared = [c for c in group if value_of(c.settings[layout.best_of]) == layout.spec.shared]
            if shared:
                chosen[key] = shared[0]
    return chosen


def edge_notes(cells: list[CellResult], layout: Layout) -> list[str]:
    """A sentence for each chosen best_of value that is the lowest or highest
    of the values tried: the best may lie beyond the grid."""
    if layout.best_of is None:
        return []
    notes = []
    for (x, arm), cell in judged_cells(cells, layout, "best").items():
        tried = sorted((c.settings[layout.best_of] for c in groups(cells, layout)[(x, arm)]), key=sort_key)
        value = cell.settings[layout.best_of]
        if len(tried) > 1 and value in (tried[0], tried[-1]):
            notes.append(f"- {layout.arm_label(arm)} at {layout.x_name} = {layout.x_label(x)}: "
                         f"{layout.names[layout.best_of]} = {format_value(value)} is the "
                         f"{'lowest' if value == tried[0] else 'highest'} value tried: the best may lie beyond the grid.")
    return notes


# ---------------------------------------------------------------------------
# Statistics with intervals, and verdicts
# ---------------------------------------------------------------------------
def interval(cell: CellResult, stat: str, sensitivities: dict | None = None, key=None) -> tuple[float, float, float]:
    """(value, low, high) of a STATS figure, unbounded ends as 0 or +inf
    (lr_sensitivity: of the cell's (x, arm), `key`, in `sensitivities`)."""
    if stat == "lr_sensitivity":
        value = (sensitivities or {}).get(key) or {}
        return tuple(math.nan if value.get(k) is None else value[k] for k in ("sensitivity", "low", "high"))
    if stat == "median_time":
        km = cell.time()
        value = math.inf if km.median is None else float(km.median)
        return value, 0.0 if km.low is None else float(km.low), math.inf if km.high is None else float(km.high)
    if stat == "final_loss":
        loss = cell.final_loss()
        return tuple(math.inf if v is None else v for v in (loss["median"], loss["low"], loss["high"]))
    rate = cell.rate({"success_rate": "success", "stall_rate": "stalled", "divergence_rate": "diverged"}[stat])
    return (math.nan if rate["rate"] is None else rate["rate"]), rate["low"], rate["high"]


def judge(expectation: Expectation, cells: list[CellResult], layout: Layout, sensitivities: dict | None = None) -> dict:
    """The expectation's verdict and, at each x it covers, the numbers behind
    it; lr_sensitivity is read from `sensitivities` ((x, arm) -> lr_sensitivity)."""
    chosen = judged_cells(cells, layout, expectation.at)
    wanted = dict(expectation.where)
    xs = sorted({x for x, _ in chosen
                 if all(value_of(v) in wanted.get(k, (value_of(v),)) for k, v in zip(layout.x, x))}, key=lambda x: [sort_key(v) for v in x])
    arm = tuple(value_of(v) for _, v in expectation.arm)
    other = None if expectation.better_than is None else tuple(value_of(v) for _, v in expectation.better_than)
    larger_is_better = STATS[expectation.stat]
    points = []
    for x in xs:
        point = {"x": [json_number(v) for v in x]}
        mine = chosen.get((x, arm))
        theirs = chosen.get((x, other)) if other is not None else None
        if mine is None or not mine.n or (other is not None and (theirs is None or not theirs.n)):
            point.update(verdict=INCONCLUSIVE, note="no finished runs")  # no evidence: no verdict either way
            points.append(point)
            continue
        value, low, high = interval(mine, expectation.stat, sensitivities, (x, arm))
        point.update(value=value, low=low, high=high, n=mine.n)
        if other is not None:
            t_value, t_low, t_high = interval(theirs, expectation.stat, sensitivities, (x, other))
            point.update(other_value=t_value, other_low=t_low, other_high=t_high, other_n=theirs.n)
            better, worse = (low > t_high, high < t_low) if larger_is_better else (high < t_low, low > t_high)
        elif expectation.above is not None:
            better, worse = low > expectation.above, high < expectation.above
        else:
            better, worse = high < expectation.below, low > expectation.below
        point["verdict"] = CONFIRMED if better else NOT_CONFIRMED if worse else INCONCLUSIVE
        points.append(point)
    verdicts = [p["verdict"] for p in points]
    overall = (NOT_CONFIRMED if NOT_CONFIRMED in verdicts else CONFIRMED if verdicts and all(v == CONFIRMED for v in verdicts)
               else INCONCLUSIVE)
    return {"id": expectation.id, "claim": expectation.claim, "rule": rule_text(expectation, layout),
            "verdict": overall, "at": expectation.at, "points": points}


def rule_text(e: Expectation, layout: Layout) -> str:
    arm = layout.arm_label(tuple(v for _, v in e.arm))
    if e.better_than is not None:
        how = "higher" if STATS[e.stat] else "lower"
        rule = (f"{e.stat} of {arm} {how} than of {layout.arm_label(tuple(v for _, v in e.better_than))} "
                "(their 95% intervals apart)")
    else:
        side = "above" if e.above is not None else "below"
        rule = f"{e.stat} of {arm} {side} {e.above if e.above is not None else e.below:g} (its 95% interval wholly {side})"
    where = "; ".join(f"{layout.names[k]} in {', '.join(map(format_value, v))}" for k, v in e.where)
    setting = layout.names[layout.best_of] if layout.best_of else "setting"
    return f"{rule}, at {'each arm' + chr(39) + 's best' if e.at == 'best' else 'the shared'} {setting}" \
        + (f", {where}" if where else "")


def json_number(value):
    """A number or string as JSON takes it (inf as the string 'inf')."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf" if value < 0 else None
    return value
