"""An experiment file's `report:` section, checked: how its results are laid out, selected and judged.

(An example is in attn.experiment.spec's docstring.)

Every key of `report:` is optional and checked here: x, arm and best_of
name grid keys, each in one role; `select` is a list of criteria, each
'max <figure>' or 'min <figure>' of SELECTION_FIGURES; `shared` is one of
best_of's values. An expectation names a `stat` of STATS, the cells of one
arm (`arm`: a value of every arm key), where along x (`where`, default
everywhere), `at` (best, shared, or every: a bound that must hold at each
value of best_of, not only at the chosen one) and one rule: `better_than` another arm
(intervals separated the right way: confirmed; the wrong way: not
confirmed; overlapping: inconclusive), or `above` / `below` a number (the
interval wholly on the claimed side, wholly on the other, or across it).
Each arm a claim names has a cell at every point it is judged at (each x
within `where`; at: shared, with the shared value), or the claim is refused:
such a point would never give evidence, and the claim never be confirmed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from statistics import NormalDist

from attn.config.loading import integer_problem
from attn.config.schema import Config
from attn.config.yamlio import ConfigError, closest, did_you_mean, show_value, truncate

REPORT_KEYS = (
    "x",
    "arm",
    "best_of",
    "select",
    "shared",
    "expect",
    "sensitivity",
    "lengths",
    "alpha",
    "select_on",
    "judge_on",
)
SELECTION_FIGURES = ("success_rate", "stall_rate", "divergence_rate", "median_time", "final_loss")
DEFAULT_SELECT = ("max success_rate", "min median_time", "min final_loss")
# stat -> whether larger is better (for better_than); each comes with a 95% interval (attn.analysis.results)
STATS = {
    "success_rate": True,
    "stall_rate": False,
    "divergence_rate": False,
    "median_time": False,
    "final_loss": False,
    "lr_sensitivity": False,
}
EXPECTATION_KEYS = (
    "id",
    "claim",
    "stat",
    "arm",
    "better_than",
    "above",
    "below",
    "where",
    "at",
    "test",
    "edited_after_runs",
    "budget",
)
RATES = ("success_rate", "stall_rate", "divergence_rate")
# test -> the stats it can judge a better_than claim on; `interval` judges every claim
TESTS = {"mcnemar": RATES, "fisher": RATES, "sign": ("median_time",), "interval": tuple(STATS)}
DEFAULT_ALPHA = 0.05
EDITED_SAID = "edited after runs of its seeds had been seen, so not an independent test"  # beside such a claim


@dataclass(frozen=True)
class Expectation:
    """One claim of the experiment file, judged by attn.report.experiment_report."""

    id: str
    claim: str
    stat: str  # a key of STATS
    arm: tuple[tuple[str, object], ...]  # the arm's value of every arm key
    at: str  # best | shared | every (a bound at each value of best_of)
    where: tuple[tuple[str, tuple], ...] = ()  # x key -> the values it is judged at (none: all)
    better_than: tuple[tuple[str, object], ...] | None = None
    above: float | None = None
    below: float | None = None
    test: str = "interval"  # a key of TESTS: mcnemar, fisher, sign (better_than only) or interval
    # what was edited after runs of its seeds had been seen, and where: a claim's history, which a re-run that
    # freezes the edited claim anew would otherwise hide; the reports and the published text mark it. Not part
    # of the claim's rule (expectation_text), so declaring it changes no verdict and no digest
    edited_after_runs: str = ""
    # judged as if every run had stopped at this step (its seeds re-classified on their curves up to it, each
    # arm's best chosen there too): "learns within B steps"; None: the experiment's budget
    budget: int | None = None


@dataclass(frozen=True)
class ReportSpec:
    """The `report:` section, checked."""

    x: tuple[str, ...]
    arm: tuple[str, ...]
    best_of: str | None = None
    select: tuple[str, ...] = DEFAULT_SELECT
    shared: object = None
    expect: tuple[Expectation, ...] = ()
    sensitivity: bool = False  # with best_of a rate: each (x, arm)'s learning-rate sensitivity (Wortsman et al.)
    lengths: tuple[int, ...] = ()  # retrieval pairs to ask each judged model about (attn.analysis.lengths)
    alpha: float = DEFAULT_ALPHA  # the family-wise level of the tested claims (Holm across them)
    # held-out selection: the seeds the best setting is chosen on, and the disjoint seeds every verdict and
    # headline table is judged on (None: all the file's seeds, both)
    select_on: tuple[int, ...] | None = None
    judge_on: tuple[int, ...] | None = None
    # each expectation's power from the design alone (id -> report_spec.power), frozen with the claims
    power: tuple[tuple[str, dict], ...] = ()


def check_report(
    report,
    grid_keys: list[str],
    grid_values: dict,
    source: str,
    partial_keys=(),
    n_seeds: int | None = None,
    budget: int | None = None,
    seeds=None,
    grid_cells=(),
) -> ReportSpec:
    """The experiment's `report:` section (module docstring), checked: x and
    arm a grid key or a list of them, best_of one grid key, no key in two
    roles (x defaults to the first grid key, arm to the next one that is not
    best_of); the selection rule, the shared value and the expectations
    (`grid_cells`, the grid's settings as hashable values: the points a
    claim covers, for whether it can fail)."""
    _check_mapping(report, REPORT_KEYS, f"{source}: report")
    role_of = {}
    for role in (r for r in ("x", "arm", "best_of") if r in report):
        value = report[role]
        names = [value] if isinstance(value, str) else value
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) for n in names)
            or (role == "best_of" and not isinstance(value, str))
        ):
            expected = "one grid key" if role == "best_of" else "a grid key or a list of grid keys"
            raise ConfigError(
                f"{source}: report: {role}: got {truncate(repr(value))}; expected {expected} ({', '.join(grid_keys)})"
            )
        for name in names:
            if name not in grid_keys:
                raise ConfigError(
                    f"{source}: report: {role}: `{truncate(name)}` is not a key of the grid"
                    f"{did_you_mean(*closest(name, grid_keys))}; expected one of {', '.join(grid_keys)}"
                )
            if name in role_of:
                raise ConfigError(
                    f"{source}: report: {role}: `{name}` is already the report's {role_of[name]}; "
                    "a grid key has one role"
                )
            role_of[name] = role
    best_of = report.get("best_of")
    rest = [k for k in grid_keys if k != best_of]
    x = _names(report.get("x")) or rest[:1]
    arm = _names(report.get("arm")) or [k for k in rest if k not in x][:1]
    select = tuple(_check_select(report.get("select", list(DEFAULT_SELECT)), source))
    shared = report.get("shared")
    if shared is not None and (best_of is None or shared not in grid_values.get(best_of, ())):
        values = ", ".join(map(str, grid_values.get(best_of, ()))) if best_of else "none: no best_of"
        raise ConfigError(
            f"{source}: report: shared: got {truncate(repr(shared))}; expected one of best_of's values ({values})"
        )
    expect = report.get("expect") or []
    if not isinstance(expect, list):
        raise ConfigError(f"{source}: report: expect: got {truncate(repr(expect))}; expected a list of expectations")
    sensitivity = report.get("sensitivity", False)
    if not isinstance(sensitivity, bool):
        raise ConfigError(f"{source}: report: sensitivity: got {truncate(repr(sensitivity))}; expected true or false")
    if sensitivity and best_of is None:
        raise ConfigError(
            f"{source}: report: sensitivity: got true without a best_of; expected a best_of, the rate "
            "it is measured over, or sensitivity: false"
        )
    lengths = report.get("lengths", [])
    if not isinstance(lengths, list) or any(integer_problem(n, ge=1) for n in lengths):
        raise ConfigError(
            f"{source}: report: lengths: got {truncate(repr(lengths))}; expected a list of numbers of "
            f"retrieval pairs, each {integer_problem(0, ge=1)}, e.g. [8, 32, 128]"
        )
    alpha = report.get("alpha", DEFAULT_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ConfigError(
            f"{source}: report: alpha: got {truncate(repr(alpha))}; expected a level in (0, 1), e.g. 0.05"
        )
    select_on, judge_on = _check_held_out(report, seeds, best_of, source)
    spec = ReportSpec(
        tuple(x),
        tuple(arm),
        best_of,
        select,
        shared,
        sensitivity=sensitivity,
        lengths=tuple(lengths),
        alpha=float(alpha),
        select_on=select_on,
        judge_on=judge_on,
    )
    if judge_on is not None:
        n_seeds = len(judge_on)  # the verdicts are judged on these seeds only
    checked = [
        _check_expectation(e, spec, grid_values, partial_keys, f"{source}: report: expect[{i}]", budget)
        for i, e in enumerate(expect)
    ]
    ids = [e.id for e in checked]
    if len(set(ids)) != len(ids):
        raise ConfigError(
            f"{source}: report: expect: the id `{next(i for i in ids if ids.count(i) > 1)}` is used twice"
        )
    points = [_points(e, spec, grid_cells, f"{source}: report: expect[{i}] ({e.id})") for i, e in enumerate(checked)]
    powers = []
    if n_seeds is not None:
        tested = sum(e.test != "interval" for e in checked)
        for i, e in enumerate(checked):
            level = spec.alpha / max(tested, 1)
            powers.append((e.id, power(e, n_seeds, level if e.test != "interval" else 0.05)))
            reason = cannot_fail(e, n_seeds, budget, level, points[i])
            if reason:
                needed = seeds_needed(e, budget, level, points[i])
                more = (
                    f"; it would need {needed} judging seeds per arm"
                    if needed is not None
                    else "; no number of seeds would make it decidable"
                )
                raise ConfigError(
                    f"{source}: report: expect[{i}] ({e.id}): {reason}{more}, or restate it as a claim that "
                    "some outcome of the runs would refute"
                )
    return dataclasses.replace(spec, expect=tuple(checked), power=tuple(powers))


def _check_held_out(report: dict, seeds, best_of, source: str) -> tuple:
    """select_on and judge_on: both or neither, each a non-empty list of distinct seeds of the file,
    disjoint, and only with a best_of (the setting they choose)."""
    given = [k for k in ("select_on", "judge_on") if k in report]
    if not given:
        return None, None
    if len(given) == 1:
        missing = "judge_on" if given == ["select_on"] else "select_on"
        raise ConfigError(
            f"{source}: report: {given[0]}: given without `{missing}`; expected both, disjoint "
            "subsets of the file's seeds"
        )
    if best_of is None:
        raise ConfigError(
            f"{source}: report: select_on: got {truncate(repr(report['select_on']))} with no best_of; "
            "expected a best_of for the selection seeds to choose"
        )
    known = list(seeds) if seeds is not None else None
    checked = {}
    for key in given:
        value = report[key]
        if (
            not isinstance(value, list)
            or not value
            or any(isinstance(s, bool) or not isinstance(s, int) for s in value)
            or len(set(value)) != len(value)
            or (known is not None and not set(value) <= set(known))
        ):
            accepted = f"({', '.join(map(str, known))})" if known is not None else ""
            raise ConfigError(
                f"{source}: report: {key}: got {truncate(repr(value))}; expected a non-empty list of "
                f"distinct seeds of the file's `seeds` {accepted}".rstrip()
            )
        checked[key] = tuple(value)
    both = sorted(set(checked["select_on"]) & set(checked["judge_on"]))
    if both:
        raise ConfigError(
            f"{source}: report: judge_on: got {truncate(repr(report['judge_on']))}, sharing seed(s) "
            f"{', '.join(map(str, both))} with select_on; expected seeds disjoint from select_on"
        )
    return checked["select_on"], checked["judge_on"]


def _wilson_extremes(n: int) -> tuple[float, float]:
    """The 95% Wilson interval's upper bound at 0/n, z²/(n + z²), and its lower
    bound at n/n, n/(n + z²) (closed forms of attn.analysis.stats.wilson_interval,
    which this layer does not import; tests/test_verdicts_tests.py checks they agree)."""
    z2 = NormalDist().inv_cdf(0.975) ** 2
    return z2 / (n + z2), n / (n + z2)


def _label(keys, values) -> str:
    """'{model.scale: sqrt, optim.name: sgd}': grid values by key, a key a grid block does not set (None) left out."""
    return show_value({k: v for k, v in zip(keys, values) if v is not None})


def _points(e: Expectation, spec: ReportSpec, grid_cells, where_: str) -> int:
    """How many points (x values) the expectation is judged at, taken as attn.analysis.verdicts.judge
    takes them: each x within `where` with a cell at the claim's setting (at: shared, the shared value).
    ConfigError when its arm or better_than is no arm of the grid, or lacks a cell at one of those
    points, or there is no point: a point without its arms' cells never gives evidence, so the
    claim could never be confirmed."""

    def place(cell) -> tuple:  # (x, arm) of a grid cell
        return tuple(cell.get(k) for k in spec.x), tuple(cell.get(k) for k in spec.arm)

    def at_setting(cell) -> bool:  # a cell the claim is judged on (at: shared, only those at the shared value)
        return e.at != "shared" or cell.get(spec.best_of) == spec.shared

    named = {"arm": tuple(v for _, v in e.arm)}
    if e.better_than is not None:
        named["better_than"] = tuple(v for _, v in e.better_than)
    arms = list(dict.fromkeys(place(c)[1] for c in grid_cells))
    for field, arm in named.items():
        if arm not in arms:
            raise ConfigError(
                f"{where_}: {field}: got {_label(spec.arm, arm)}, which no cell of the grid has; "
                f"expected one of the grid's arms ({', '.join(_label(spec.arm, a) for a in arms)})"
            )
    wanted = dict(e.where)
    in_where = [c for c in grid_cells if all(c.get(k) in values for k, values in wanted.items())]
    held = {place(c) for c in grid_cells if at_setting(c)}
    xs = list(dict.fromkeys(place(c)[0] for c in in_where if at_setting(c)))
    given = f"got {show_value(wanted)}" if wanted else "got none (every x of the grid)"
    if not xs:
        if e.at == "shared" and in_where:
            raise ConfigError(
                f"{where_}: at: got shared, but no cell within its `where` has {spec.best_of} = "
                f"{spec.shared}; expected best, or a `where` that holds such cells"
            )
        raise ConfigError(
            f"{where_}: where: {given}, values no cell of the grid has together; expected values of "
            f"one cell's {', '.join(spec.x)}"
        )
    for x in xs:
        for field, arm in named.items():
            if (x, arm) in held:
                continue
            if e.at == "shared" and any(place(c) == (x, arm) for c in grid_cells):
                raise ConfigError(
                    f"{where_}: at: got shared, but {field} {_label(spec.arm, arm)} has no cell with "
                    f"{spec.best_of} = {spec.shared} at {_label(spec.x, x)}; expected best, or a "
                    "`where` without that point"
                )
            covered = [
                _label(spec.x, y)
                for y in dict.fromkeys(place(c)[0] for c in grid_cells if at_setting(c))
                if all((y, a) in held for a in named.values())
            ]
            raise ConfigError(
                f"{where_}: where: {given}, but {field} {_label(spec.arm, arm)} has no cell at "
                f"{_label(spec.x, x)}; expected x values where the claim's arms all have cells "
                f"({', '.join(covered) or 'none'})"
            )
    return len(xs)


def smallest_p(test: str, n: int) -> float:
    """The smallest one-sided p an exact test reaches on n seeds per arm: n vs 0 of n
    (McNemar's n discordant pairs all one way, the sign test's n ordered pairs, Fisher's n/n against 0/n)."""
    return 1 / math.comb(2 * n, n) if test == "fisher" else 0.5**n


MAX_SEEDS_SEARCHED = 100_000  # seeds_needed looks no further


def seeds_needed(e: Expectation, budget: int | None, level: float, points: int = 1) -> int | None:
    """The fewest judging seeds per arm with which the expectation could be both confirmed
    and not confirmed (cannot_fail says ''); None if no number up to MAX_SEEDS_SEARCHED would."""
    if cannot_fail(e, MAX_SEEDS_SEARCHED, budget, level, points):
        return None
    low, high = 1, MAX_SEEDS_SEARCHED  # cannot_fail is monotone in n: more seeds never make a claim less decidable
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if not cannot_fail(e, middle, budget, level, points) else (middle + 1, high)
    return low


def power(e: Expectation, n: int, level: float) -> dict:
    """What the claim's test can show on n judging seeds per arm, from the design alone (stated before
    the runs): the smallest p it can reach, the level it is held to (alpha over the tested claims, the
    strictest step of Holm's procedure), and the smallest effect that could confirm it there."""
    out = {"test": e.test, "n": n, "level": level}
    if e.test in ("mcnemar", "sign", "fisher"):
        out["smallest_p"] = smallest_p(e.test, n)
        if e.test == "fisher":
            k = next((k for k in range(1, n + 1) if math.comb(n, k) / math.comb(2 * n, k) <= level), None)
            out["smallest_effect"] = (
                f"{k} of {n} against 0 of {n} (a difference of rates of {k / n:.2g})"
                if k
                else "none: no split of the seeds reaches the level"
            )
        else:
            d = next((d for d in range(1, n + 1) if 0.5**d <= level), None)
            pairs = "discordant pairs" if e.test == "mcnemar" else "pairs ordered by their times"
            out["smallest_effect"] = (
                f"{d} {pairs}, all in the claim's favour"
                + (f" (a difference of rates of {d / n:.2g})" if e.test == "mcnemar" else "")
                if d
                else "none: no split of the seeds reaches the level"
            )
        return out
    if e.stat in RATES and e.better_than is None:
        bound = e.above if e.above is not None else e.below
        wilson = lambda k: _wilson(k, n)  # noqa: E731
        if e.above is not None:
            k = next((k for k in range(n + 1) if wilson(k)[0] > bound), None)
            out["smallest_effect"] = (
                f"{k} of {n} seeds (its 95% interval then above {bound:g})" if k is not None else "none"
            )
        else:
            k = next((k for k in range(n, -1, -1) if wilson(k)[1] < bound), None)
            out["smallest_effect"] = (
                f"at most {k} of {n} seeds (its 95% interval then below {bound:g})" if k is not None else "none"
            )
        return out
    out["smallest_effect"] = "95% intervals wholly on the claimed side"
    return out


def _wilson(k: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of k of n (attn.analysis.stats.wilson_interval's formula, which this layer
    does not import; tests/test_verdicts_tests.py checks they agree)."""
    z = NormalDist().inv_cdf(0.975)
    p, z2 = k / n, z * z
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def cannot_fail(e: Expectation, n: int, budget: int | None, level: float, points: int = 1) -> str:
    """Why the expectation's rule could never give one of its verdicts,
    "not confirmed" or "confirmed", with `n` seeds per arm, a budget of
    `budget` steps, its tests at `level` (the smallest Holm level, alpha
    over the number of tested claims) over `points` x values; '' if both
    can happen. Judged from the rule and the design alone, before any run:
    a rate's Wilson interval at 0/n and n/n, the smallest p-value an exact
    test can reach on n seeds (one point against the claim refutes it,
    Bonferroni over its points: attn.analysis.verdicts.claim_p), a median
    time's range [0, budget], a loss's and a learning-rate sensitivity's [0, inf)."""
    never = {}  # verdict -> why it cannot happen
    budget = e.budget if e.budget is not None else budget
    if e.better_than is not None:
        if e.better_than == e.arm:
            return "it compares an arm with itself"
        if e.test in ("mcnemar", "sign", "fisher"):
            smallest = smallest_p(e.test, n)  # n vs 0 of n
            if smallest > level:
                return (
                    f"the {e.test} test on {n} seeds per arm cannot reach p <= {level:.3g} (its smallest p is "
                    f"{smallest:.3g}), so it can be neither confirmed nor refuted; use more seeds or `test: interval`"
                )
            if smallest * points > level:
                return (
                    f"it can never be not confirmed: one of its {points} points refutes it at p <= {level:.3g} "
                    f"only after a Bonferroni factor of {points}, and the {e.test} test on {n} seeds per arm "
                    f"reaches at least {smallest:.3g}; use more seeds or fewer points"
                )
        elif e.stat in RATES:
            high, low = _wilson_extremes(n)
            if low <= high:
                return (
                    f"the 95% Wilson intervals of two rates on {n} seeds always overlap (n/n gives [{low:.3g}, 1], "
                    f"0/n [0, {high:.3g}]), so it can be neither confirmed nor refuted"
                )
        return ""
    side = "above" if e.above is not None else "below"
    bound = e.above if e.above is not None else e.below
    if e.stat in RATES:
        lowest_high, highest_low = _wilson_extremes(n)
        if side == "above":
            if not lowest_high < bound:
                never["not confirmed"] = f"the Wilson upper bound at 0/{n} is {lowest_high:.3g}, never below {bound:g}"
            if not highest_low > bound:
                never["confirmed"] = f"the Wilson lower bound at {n}/{n} is {highest_low:.3g}, never above {bound:g}"
        else:
            if not highest_low > bound:
                never["not confirmed"] = (
                    f"the Wilson lower bound at {n}/{n} is {highest_low:.3g}, never above {bound:g}"
                )
            if not lowest_high < bound:
                never["confirmed"] = f"the Wilson upper bound at 0/{n} is {lowest_high:.3g}, never below {bound:g}"
    elif e.stat == "median_time" and budget is not None:
        # a median lies in (0, budget] or is "> budget" (its interval [<= budget, inf))
        if side == "above":
            if bound <= 0:
                never["not confirmed"] = f"a median time is never below {bound:g}"
            if bound >= budget:
                never["confirmed"] = (
                    f"a median time's lower bound is at most the budget, {budget}, never above {bound:g}"
                )
        else:
            if bound >= budget:
                never["not confirmed"] = (
                    f"a median time's lower bound is at most the budget, {budget}, never above {bound:g}"
                )
            if bound <= 0:
                never["confirmed"] = f"a median time is never below {bound:g}"
    elif e.stat == "final_loss":
        if side == "above" and bound <= 0:  # a cross-entropy is above 0
            never["not confirmed"] = f"a loss is never below {bound:g}"
        if side == "below" and bound <= 0:
            never["confirmed"] = f"a loss is never below {bound:g}"
    elif e.stat == "lr_sensitivity":  # a mean over seeds of mean(min(loss, L0)) - L* >= 0, and its interval's ends
        if side == "above" and bound <= 0:
            never["not confirmed"] = f"a learning-rate sensitivity is never below {bound:g}"
        if side == "below" and bound <= 0:
            never["confirmed"] = f"a learning-rate sensitivity is never below {bound:g}"
    return "; ".join(f"it can never be {verdict}: {why}" for verdict, why in never.items())


def _check_mapping(value, keys: tuple, where_: str) -> None:
    """A mapping whose keys are all of `keys`, or one line naming what is not."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where_}: got {truncate(repr(value))}; expected a mapping with keys {', '.join(keys)}")
    for key in value:
        if key not in keys:
            raise ConfigError(
                f"{where_}: unknown key `{truncate(str(key))}`{did_you_mean(*closest(key, keys))}; "
                f"expected {', '.join(keys)}"
            )


def _names(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _check_select(select, source: str) -> list[str]:
    if not isinstance(select, list) or not select or not all(isinstance(c, str) for c in select):
        raise ConfigError(
            f"{source}: report: select: got {truncate(repr(select))}; expected a list of criteria such as "
            f"[{', '.join(DEFAULT_SELECT)}]"
        )
    for criterion in select:
        direction, _, figure = criterion.partition(" ")
        if direction not in ("max", "min") or figure not in SELECTION_FIGURES:
            raise ConfigError(
                f"{source}: report: select: got {truncate(repr(criterion))}; expected 'max <figure>' or "
                f"'min <figure>' with a figure of {', '.join(SELECTION_FIGURES)}"
            )
    return select


def _check_expectation(
    entry, spec: ReportSpec, grid_values: dict, partial_keys, where_: str, budget: int | None = None
) -> Expectation:
    """One expectation of the file, checked against the grid and the report's layout."""
    _check_mapping(entry, EXPECTATION_KEYS, where_)
    for key in ("id", "claim", "stat", "arm"):
        if key not in entry:
            raise ConfigError(f"{where_}: missing `{key}`")
    if not isinstance(entry["id"], str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", entry["id"]):
        raise ConfigError(
            f"{where_}: id: got {truncate(repr(entry['id']))}; expected a name of letters, digits, '_', '.', '-'"
        )
    if not isinstance(entry["claim"], str) or not entry["claim"].strip():
        raise ConfigError(f"{where_}: claim: got {truncate(repr(entry['claim']))}; expected the claim, in words")
    if entry["stat"] not in STATS:
        raise ConfigError(f"{where_}: stat: got {truncate(repr(entry['stat']))}; expected one of {', '.join(STATS)}")
    if entry["stat"] == "lr_sensitivity" and not spec.sensitivity:
        raise ConfigError(f"{where_}: stat: lr_sensitivity needs `sensitivity: true` in the report section")
    arm = _check_arm(entry["arm"], spec, grid_values, partial_keys, f"{where_}: arm")
    rules = [k for k in ("better_than", "above", "below") if k in entry]
    if len(rules) != 1:
        raise ConfigError(
            f"{where_}: got {len(rules)} rules ({', '.join(rules) or 'none'}); expected exactly one "
            "of better_than, above, below"
        )
    better_than = (
        _check_arm(entry["better_than"], spec, grid_values, partial_keys, f"{where_}: better_than")
        if "better_than" in entry
        else None
    )
    bound = {}
    for key in ("above", "below"):
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{where_}: {key}: got {truncate(repr(value))}; expected a number")
            bound[key] = float(value)
    at = entry.get("at", "best")
    accepted_at = ["best"] + (["shared"] if spec.shared is not None else []) + (["every"] if spec.best_of else [])
    if at not in accepted_at:
        raise ConfigError(
            f"{where_}: at: got {truncate(repr(at))}; expected {' or '.join(accepted_at)}"
            + ("" if spec.shared is not None else " (the report has no `shared` value)")
        )
    if at == "every" and entry["stat"] == "lr_sensitivity":
        raise ConfigError(
            f"{where_}: at: every is for a statistic of each {spec.best_of} value; lr_sensitivity is "
            f"one figure over all of them: expected at: best"
        )
    if at == "every" and better_than is not None:
        raise ConfigError(
            f"{where_}: at: every is for a bound (above or below) that must hold at each "
            f"{spec.best_of}; a comparison is made at each arm's best or the shared value"
        )
    where = entry.get("where") or {}
    if not isinstance(where, dict):
        raise ConfigError(
            f"{where_}: where: got {truncate(repr(where))}; expected a mapping of x key -> list of values"
        )
    checked_where = []
    for key, values in where.items():
        if key not in spec.x:
            raise ConfigError(
                f"{where_}: where: `{truncate(str(key))}` is not an x key of the report; expected {', '.join(spec.x)}"
            )
        values = values if isinstance(values, list) else [values]
        unknown = [v for v in values if v not in grid_values[key]]
        if unknown or not values:
            raise ConfigError(
                f"{where_}: where: {key}: got {truncate(repr(unknown or values))}; expected values of the "
                f"grid ({', '.join(map(str, grid_values[key]))})"
            )
        checked_where.append((key, tuple(values)))
    default = (
        ("mcnemar" if entry["stat"] in RATES else "sign" if entry["stat"] == "median_time" else "interval")
        if better_than is not None
        else "interval"
    )  # paired: every arm of an experiment runs the same seeds
    test = entry.get("test", default)
    accepted = [
        t for t, stats in TESTS.items() if entry["stat"] in stats and (better_than is not None or t == "interval")
    ]
    if test not in accepted:
        raise ConfigError(
            f"{where_}: test: got {truncate(repr(test))}; expected one of {', '.join(accepted)} for "
            f"{'a comparison' if better_than is not None else 'a bound'} on {entry['stat']}"
        )
    edited = entry.get("edited_after_runs", "")
    if "edited_after_runs" in entry and (not isinstance(edited, str) or not edited.strip() or "\n" in edited.strip()):
        raise ConfigError(
            f"{where_}: edited_after_runs: got {truncate(repr(edited))}; expected one line saying what was "
            "edited after which runs"
        )
    within = entry.get("budget")
    if within is not None and (
        integer_problem(within, ge=1) or (budget is not None and within > budget) or entry["stat"] == "lr_sensitivity"
    ):
        expected = (
            "no budget: lr_sensitivity is measured at the end"
            if entry["stat"] == "lr_sensitivity"
            else f"a step from 1 to the experiment's budget, {budget}"
        )
        raise ConfigError(f"{where_}: budget: got {truncate(repr(within))}; expected {expected}")
    return Expectation(
        entry["id"],
        str(entry["claim"]),
        entry["stat"],
        arm,
        at,
        tuple(checked_where),
        better_than,
        bound.get("above"),
        bound.get("below"),
        test,
        edited.strip(),
        within,
    )


def _check_arm(value, spec: ReportSpec, grid_values: dict, partial_keys, where_: str) -> tuple:
    """An arm as (key, value) for every arm key, each value in the grid; an
    arm key may be left out only if some grid block does not set it (None)."""
    optional = [k for k in spec.arm if k in partial_keys]
    if not isinstance(value, dict) or not set(spec.arm) - set(optional) <= set(value) <= set(spec.arm):
        raise ConfigError(
            f"{where_}: got {truncate(repr(value))}; expected a mapping giving each arm key "
            f"({', '.join(spec.arm)}) one of its grid values"
            + (f" (or leaving out {', '.join(optional)}, which some blocks do not set)" if optional else "")
        )
    for key, v in value.items():
        if v not in grid_values[key]:
            raise ConfigError(
                f"{where_}: {key}: got {truncate(repr(v))}; expected one of {', '.join(map(str, grid_values[key]))}"
            )
    return tuple((k, value.get(k)) for k in spec.arm)


def check_lengths(config: Config, pairs: list[int], source: str) -> None:
    """One line (ConfigError) if this run's model cannot be asked about these
    lengths of retrieval (attn.analysis.lengths): a retrieval model whose positions do not
    fix its length, and no more pairs than keys."""
    if config.task.name != "retrieval" or config.model.positional == "learned":
        raise ConfigError(
            f"{source}: lengths: a retrieval model whose positions do not fix its length "
            f"(model.positional none or sinusoidal) is needed; this one is {config.task.name} with "
            f"positional {config.model.positional}"
        )
    if max(pairs) > config.task.n_keys:
        raise ConfigError(
            f"{source}: lengths: got {max(pairs)} pairs; expected at most task.n_keys "
            f"({config.task.n_keys}), since keys are distinct within a sequence"
        )


# ---------------------------------------------------------------------------
# The claims, frozen before the runs (attn.experiment.sweep writes them; reports compare)
# ---------------------------------------------------------------------------
CLAIMS_FILE = "claims.json"  # in the experiment's run directory, written when its sweep first starts


def expectation_text(e: Expectation) -> str:
    """One line that says everything that decides an expectation's verdict (and its claim)."""
    rule = (
        f"better_than {dict(e.better_than)}"
        if e.better_than is not None
        else f"above {e.above:g}"
        if e.above is not None
        else f"below {e.below:g}"
    )
    where = f"; where {dict(e.where)}" if e.where else ""
    within = f"; within {e.budget} steps" if e.budget is not None else ""  # absent: the digests of older claims hold
    return f"{e.stat} of {dict(e.arm)} {rule}{where}{within}; at {e.at}; test {e.test}; claim: {e.claim}"


def claims_record(spec: ReportSpec, seeds) -> dict:
    """The `report:` section as it decides verdicts (layout, selection rule, level, seeds and every
    expectation's text), and its SHA-256 digest over canonical JSON. The held-out seeds (select_on,
    judge_on) are in it when the file declares them; without them both are `seeds`, and the record
    (and its digest) is what it was before they existed."""
    section = {
        "x": list(spec.x),
        "arm": list(spec.arm),
        "best_of": spec.best_of,
        "select": list(spec.select),
        "shared": spec.shared,
        "alpha": spec.alpha,
        "seeds": sorted(seeds),
        "expect": {e.id: expectation_text(e) for e in spec.expect},
    }
    if spec.select_on is not None:
        section.update(select_on=list(spec.select_on), judge_on=list(spec.judge_on))
    text = json.dumps(section, sort_keys=True, default=str)
    record = {"digest": hashlib.sha256(text.encode()).hexdigest(), "section": json.loads(text)}
    if spec.power:  # stated before the runs beside the claims; outside the digest, which decides no verdict
        record["power"] = {claim: dict(figures) for claim, figures in spec.power}
    return record


def claim_changes(frozen: dict, current: dict) -> dict:
    """How the current claims_record differs from the frozen one: expectations changed (id -> the
    frozen text), added (ids), removed (id -> the frozen text), and the design keys changed
    (key -> [frozen, now])."""
    before, now = frozen.get("section") or {}, current["section"]
    old, new = before.get("expect") or {}, now["expect"]
    return {
        "changed": {i: old[i] for i in new if i in old and old[i] != new[i]},
        "added": [i for i in new if i not in old],
        "removed": {i: text for i, text in old.items() if i not in new},
        "design": {
            k: [before.get(k), now.get(k)]
            for k in sorted((set(before) | set(now)) - {"expect"})
            if before.get(k) != now.get(k)
        },
    }
