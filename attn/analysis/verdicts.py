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
inconclusive across it (test: interval); a bound `at: every` is judged at
each value of best_of (on the judging seeds), a point each. A comparison
may instead declare an exact test (mcnemar on paired seeds, fisher, sign on
paired censored times; judge_all): its verdict follows from the one-sided
p-values, Holm-corrected across the experiment's tested claims. Over its x values
(intervals): confirmed if every one is, not
confirmed if any is, else inconclusive. A median time not reached within
the budget counts as "> budget": +inf, with its interval's lower end at
most the budget (the budget itself when no seed reached) and upper +inf.
"""

from __future__ import annotations

import dataclasses
import math

from attn import outcomes
from attn.analysis import stats
from attn.analysis.grouping import short_names
from attn.analysis.results import CellResult, at_budget, sort_key
from attn.experiment.report_spec import RATES, STATS, Expectation
from attn.experiment.spec import Experiment
from attn.text import format_value, json_number, value_of

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
        return (
            ", ".join(f"{self.names[k]}={format_value(v)}" for k, v in zip(keys, values) if v is not None) or "all runs"
        )

    def arm_label(self, arm: tuple) -> str:
        return self.label(arm, self.arm)

    def x_label(self, x: tuple) -> str:
        return " / ".join(format_value(v) for v in x)

    @property
    def x_name(self) -> str:
        return " / ".join(self.names[k] for k in self.x)


def groups(cells: list[CellResult], layout: Layout) -> dict[tuple, list[CellResult]]:
    """(x, arm) -> its cells (one per value of best_of, or just one)."""
    out: dict[tuple, list[CellResult]] = {}
    for cell in cells:
        out.setdefault((layout.x_of(cell), layout.arm_of(cell)), []).append(cell)
    return dict(
        sorted(out.items(), key=lambda item: ([sort_key(v) for v in item[0][1]], [sort_key(v) for v in item[0][0]]))
    )


def on_seeds(cell: CellResult, seeds) -> CellResult:
    """The cell with only these seeds' runs (None: the cell itself, every seed)."""
    if seeds is None:
        return cell
    wanted = set(seeds)
    return dataclasses.replace(
        cell,
        seeds=[s for s in cell.seeds if s.seed in wanted],
        _final_loss={},
        unfinished_runs={s: status for s, status in cell.unfinished_runs.items() if s in wanted},
    )


def judged_cells(cells: list[CellResult], layout: Layout, at: str, on: str = "judge") -> dict[tuple, CellResult]:
    """(x, arm) -> the cell judged there: the selected one (`best`), the one
    at the shared value (`shared`), or the only one (no best_of). With
    held-out seeds (report `select_on` / `judge_on`) the best is chosen by the
    rule over the select_on seeds only, and the cell returned holds the
    judge_on seeds only (on="select": the select_on seeds, for reporting the
    figures that chose it; they never judge)."""
    spec = layout.spec
    shown = spec.judge_on if on == "judge" else spec.select_on
    chosen = {}
    for key, group in groups(cells, layout).items():
        if layout.best_of is None:
            chosen[key] = on_seeds(group[0], shown)
        elif at == "best":
            in_rate_order = sorted(group, key=lambda c: sort_key(c.settings[layout.best_of]))
            choosers = [on_seeds(c, spec.select_on) for c in in_rate_order]
            index = stats.select([c.selection_figures() for c in choosers], list(spec.select))
            chosen[key] = on_seeds(in_rate_order[index], shown)
        else:
            shared = [c for c in group if value_of(c.settings[layout.best_of]) == layout.spec.shared]
            if shared:
                chosen[key] = on_seeds(shared[0], shown)
    return chosen


def at_every(cells: list[CellResult], layout: Layout) -> dict[tuple, list[CellResult]]:
    """(x, arm) -> its cell at each value of best_of, in order, on the judging seeds (`at: every`)."""
    return {
        key: [
            on_seeds(c, layout.spec.judge_on) for c in sorted(group, key=lambda c: sort_key(c.settings[layout.best_of]))
        ]
        for key, group in groups(cells, layout).items()
    }


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
            notes.append(
                f"- {layout.arm_label(arm)} at {layout.x_name} = {layout.x_label(x)}: "
                f"{layout.names[layout.best_of]} = {format_value(value)} is the "
                f"{'lowest' if value == tried[0] else 'highest'} value tried: the best may lie beyond the grid."
            )
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
        value = math.inf if km.median is None else float(km.median)  # not reached: "> budget", [low <= budget, inf)
        low = float(km.low) if km.low is not None else float(cell.budget) if km.median is None else 0.0
        return value, low, math.inf if km.high is None else float(km.high)
    if stat == "final_loss":
        loss = cell.final_loss()
        return tuple(math.inf if v is None else v for v in (loss["median"], loss["low"], loss["high"]))
    rate = cell.rate({"success_rate": "success", "stall_rate": "stalled", "divergence_rate": "diverged"}[stat])
    return (math.nan if rate["rate"] is None else rate["rate"]), rate["low"], rate["high"]


def judge(
    expectation: Expectation,
    cells: list[CellResult],
    layout: Layout,
    sensitivities: dict | None = None,
    cells_at_budget: dict[int, list[CellResult]] | None = None,
) -> dict:
    """The expectation's verdict and, at each x it covers, the numbers behind
    it; lr_sensitivity is read from `sensitivities` ((x, arm) -> lr_sensitivity). A claim with a
    `budget` is judged on the cells as if every run had stopped there, each arm's best chosen there too
    (at_budget; `cells_at_budget`: budget -> those cells, made once for the claims that share it)."""
    if expectation.budget is not None:
        made = (cells_at_budget or {}).get(expectation.budget)
        cells = made if made is not None else [at_budget(cell, expectation.budget) for cell in cells]
    chosen = (
        at_every(cells, layout)
        if expectation.at == "every"
        else {key: [cell] for key, cell in judged_cells(cells, layout, expectation.at).items()}
    )
    wanted = dict(expectation.where)
    xs = sorted(
        {x for x, _ in chosen if all(value_of(v) in wanted.get(k, (value_of(v),)) for k, v in zip(layout.x, x))},
        key=lambda x: [sort_key(v) for v in x],
    )
    arm = tuple(value_of(v) for _, v in expectation.arm)
    other = None if expectation.better_than is None else tuple(value_of(v) for _, v in expectation.better_than)
    larger_is_better = STATS[expectation.stat]
    points = []
    # one point per x, or per x and value of best_of (`at: every`, a bound: no second arm)
    judged_points = [
        (x, mine, (chosen.get((x, other)) or [None])[0] if other is not None else None)
        for x in xs
        for mine in chosen.get((x, arm), [None])
    ]
    for x, mine, theirs in judged_points:
        point = {"x": [json_number(v) for v in x]}
        if expectation.at == "every" and mine is not None:
            point["setting"] = json_number(mine.settings[layout.best_of])
        if mine is None or not mine.n or (other is not None and (theirs is None or not theirs.n)):
            point.update(verdict=INCONCLUSIVE, note="no finished runs")  # no evidence: no verdict either way
            points.append(point)
            continue
        value, low, high = interval(mine, expectation.stat, sensitivities, (x, arm))
        point.update(value=value, low=low, high=high, n=mine.n)
        if expectation.test != "interval":
            t_value, t_low, t_high = interval(theirs, expectation.stat, sensitivities, (x, other))
            point.update(other_value=t_value, other_low=t_low, other_high=t_high, other_n=theirs.n)
            point.update(compare_arms(expectation, mine, theirs))
            points.append(point)
            continue
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
    if expectation.test != "interval":
        return {
            "id": expectation.id,
            "claim": expectation.claim,
            "rule": rule_text(expectation, layout),
            "verdict": INCONCLUSIVE,
            "at": expectation.at,
            "test": expectation.test,
            "points": points,
            **claim_p(points),
        }
    verdicts = [p["verdict"] for p in points]
    overall = (
        NOT_CONFIRMED
        if NOT_CONFIRMED in verdicts
        else CONFIRMED
        if verdicts and all(v == CONFIRMED for v in verdicts)
        else INCONCLUSIVE
    )
    return {
        "id": expectation.id,
        "claim": expectation.claim,
        "rule": rule_text(expectation, layout),
        "verdict": overall,
        "at": expectation.at,
        "test": "interval",
        "points": points,
    }


def judge_all(
    expectations, cells: list[CellResult], layout: Layout, sensitivities: dict | None = None, alpha: float | None = None
) -> list[dict]:
    """Every expectation judged (judge); those judged by a test (mcnemar,
    fisher, sign) then get their verdict from Holm's correction across them
    at level alpha (the report's, 0.05 by default): confirmed when the
    claim's Holm-adjusted p is <= alpha, not confirmed when the adjusted p of
    the opposite claim is, else inconclusive. The claims and their opposites
    are two families, each corrected: the chance of confirming any false
    claim is held to alpha, and so is that of refuting any true one. A claim
    over several x holds only if it holds at each (its p the largest of its
    points'); it is refuted if the opposite holds at any (the smallest of
    its points' opposite p, times their number)."""
    alpha = layout.spec.alpha if alpha is None else alpha
    budgets = {e.budget for e in expectations if e.budget is not None}  # each seed re-classified once a budget
    cells_at_budget = {budget: [at_budget(cell, budget) for cell in cells] for budget in budgets}
    judged = [judge(e, cells, layout, sensitivities, cells_at_budget) for e in expectations]
    holm_verdicts([j for j in judged if j["test"] != "interval"], alpha)
    return judged


def holm_verdicts(tested: list[dict], alpha: float) -> None:
    """Set each tested claim's Holm-adjusted p (and its opposite's), its verdict and its points' at level
    alpha, in place: the claims judged by a test, each holding its p, p_reverse and points (judge_all)."""
    # a claim's adjusted p, and each of its points', at the claim's step of Holm's procedure (its
    # multiplier and floor), so a point never reads "confirmed" at a level its claim was not held to
    at_step = lambda p, step: max(step[1], min(1.0, step[0] * p))  # noqa: E731
    steps = {key: stats.holm_steps([j[key] for j in tested]) for key in ("p", "p_reverse")}
    for key in ("p", "p_reverse"):
        for j, step in zip(tested, steps[key]):
            j[key + "_holm"] = at_step(j[key], step)
    for j, forward, reverse in zip(tested, steps["p"], steps["p_reverse"]):
        j["alpha"] = alpha
        j["verdict"] = (
            CONFIRMED if j["p_holm"] <= alpha else NOT_CONFIRMED if j["p_reverse_holm"] <= alpha else INCONCLUSIVE
        )
        for p in j["points"]:
            if "p" in p and not math.isnan(p["p"]):
                p["verdict"] = (
                    CONFIRMED
                    if at_step(p["p"], forward) <= alpha
                    else NOT_CONFIRMED
                    if at_step(p["p_reverse"] * len(j["points"]), reverse) <= alpha
                    else INCONCLUSIVE
                )


def _good(stat: str, seed) -> bool:
    """Whether a seed did well on a rate stat: learned; did not stall; did not diverge."""
    outcome = seed.outcome.outcome
    return {
        "success_rate": outcome == outcomes.LEARNED,
        "stall_rate": outcome != outcomes.STALLED,
        "divergence_rate": outcome != outcomes.DIVERGED,
    }[stat]


def compare_arms(e: Expectation, mine: CellResult, theirs: CellResult) -> dict:
    """One point of a tested claim: the one-sided p of "mine is better" and of
    the opposite, the counts, and the effect size with its 95% interval
    (a rate: mine minus theirs, Newcombe; a time: the ratio of medians,
    mine over theirs, its bounds from the two Brookmeyer–Crowley intervals;
    where one median is not reached, its point is a bound, marked `bound`)."""
    by_seed = {s.seed: s for s in theirs.seeds}
    pairs = [(s, by_seed[s.seed]) for s in mine.seeds if s.seed in by_seed]
    out: dict = {"pairs": len(pairs)}
    if e.test in ("mcnemar", "sign"):
        unpaired = sorted({s.seed for s in mine.seeds} ^ set(by_seed))
        unfinished = sum(mine.unfinished.values()) + sum(theirs.unfinished.values())
        note = (
            "no seed in both arms"
            if not pairs
            else f"not every seed finished in both arms (unpaired seeds: {', '.join(map(str, unpaired)) or 'none'}; "
            f"{unfinished} runs unfinished)"
            if unpaired or unfinished
            else None
        )
        if note:  # a seed missing from one arm is no evidence either way, and must not leave a test unseen
            return {**out, "p": math.nan, "p_reverse": math.nan, "verdict": INCONCLUSIVE, "note": note}
    if e.test == "mcnemar":
        result = stats.mcnemar_exact(
            sum(_good(e.stat, a) and not _good(e.stat, b) for a, b in pairs),
            sum(_good(e.stat, b) and not _good(e.stat, a) for a, b in pairs),
        )
    elif e.test == "fisher":
        result = stats.fisher_exact(
            sum(_good(e.stat, s) for s in mine.seeds), mine.n, sum(_good(e.stat, s) for s in theirs.seeds), theirs.n
        )
    else:
        result = stats.sign_test_censored(
            [(a.outcome.time_to_threshold, b.outcome.time_to_threshold) for a, b in pairs]
        )
    out.update(p=result.p, p_reverse=result.p_reverse, counts=result.counts)
    if e.stat in RATES:
        name = {"success_rate": "success", "stall_rate": "stalled", "divergence_rate": "diverged"}[e.stat]
        k1, k2 = mine.rate(name)["k"], theirs.rate(name)["k"]
        d, low, high = stats.newcombe_difference(k1, mine.n, k2, theirs.n)
        out["effect"] = {"name": "difference of rates", "value": d, "low": low, "high": high}
    else:
        m, m_low, m_high = interval(mine, "median_time")
        t, t_low, t_high = interval(theirs, "median_time")
        with_inf = lambda a, b: math.nan if (math.isinf(a) and math.isinf(b)) or b == 0 else a / b  # noqa: E731
        out["effect"] = {
            "name": "ratio of medians",
            "value": with_inf(m, t),
            "low": with_inf(m_low, t_high),
            "high": with_inf(m_high, t_low),
        }
        # A median not reached is only known to lie past its lower bound (the budget at least): the ratio's
        # point is then a bound, not 0 or inf.
        if math.isinf(t) and not math.isinf(m):
            out["effect"].update(value=with_inf(m, t_low), bound="at most")
        elif math.isinf(m) and not math.isinf(t):
            out["effect"].update(value=with_inf(m_low, t), bound="at least")
    return out  # its verdict comes from judge_all, at the claim's Holm-corrected level


def claim_p(points: list[dict]) -> dict:
    """A claim's p over its points (every one must hold: the largest; no
    evidence at a point: 1) and its opposite's (any one refutes: the
    smallest, Bonferroni over the points)."""
    if not points:
        return {"p": 1.0, "p_reverse": 1.0}
    ps = [1.0 if math.isnan(p.get("p", math.nan)) else p["p"] for p in points]
    reverse = [1.0 if math.isnan(p.get("p_reverse", math.nan)) else p["p_reverse"] for p in points]
    return {"p": max(ps), "p_reverse": min(1.0, min(reverse) * len(points))}


def rule_text(e: Expectation, layout: Layout) -> str:
    arm = layout.arm_label(tuple(v for _, v in e.arm))
    if e.better_than is not None:
        how = "higher" if STATS[e.stat] else "lower"
        test = {
            "interval": "their 95% intervals apart",
            "mcnemar": "exact McNemar test on the seeds both arms ran",
            "fisher": "Fisher's exact test",
            "sign": "sign test on the seeds both arms ran, of the pairs whose order is known",
        }[e.test]
        if e.test != "interval":
            test += f", one-sided, Holm-corrected across the experiment's tested claims at {layout.spec.alpha:g}"
        rule = f"{e.stat} of {arm} {how} than of {layout.arm_label(tuple(v for _, v in e.better_than))} ({test})"
    else:
        side = "above" if e.above is not None else "below"
        rule = (
            f"{e.stat} of {arm} {side} {e.above if e.above is not None else e.below:g} (its 95% interval wholly {side})"
        )
    where = "; ".join(f"{layout.names[k]} in {', '.join(map(format_value, v))}" for k, v in e.where)
    setting = layout.names[layout.best_of] if layout.best_of else "setting"
    at = {"best": "each arm's best", "shared": "the shared", "every": "every"}[e.at]
    within = f", within {e.budget} steps (each seed judged on its curve up to then)" if e.budget is not None else ""
    return f"{rule}, at {at} {setting}" + (f", {where}" if where else "") + within
