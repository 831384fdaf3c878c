"""The statistics experiment reports use: counts, arrays and functions in,
numbers out (numpy and the standard library only).

    wilson_interval     a success rate's confidence interval (Wilson score)
    kaplan_meier        the survival curve of censored times (product limit)
    km_median           its median, with the Brookmeyer–Crowley interval
    bootstrap_interval  a percentile bootstrap over seeds
    select              a lexicographic choice among candidates (e.g. a cell's learning rate)

Every confidence level is two-sided: z = Φ⁻¹(1 − (1 − confidence)/2).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from itertools import accumulate
from statistics import NormalDist
from typing import NamedTuple

import numpy as np


def _z(confidence: float) -> float:
    """The two-sided normal quantile of a confidence level in (0, 1)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: got {confidence}; expected a level in (0, 1), e.g. 0.95")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval for a proportion: the p whose score test
    (p̂ − p)² <= z² p(1 − p)/n accepts, with p̂ = successes/n,

        centre ± half = (p̂ + z²/2n ± z sqrt(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n).

    The bounds are exactly 0 at 0 successes and 1 at n (set so, not left
    to rounding). n = 0 gives (0.0, 1.0): no evidence."""
    if not (0 <= successes <= n and int(successes) == successes and int(n) == n):
        raise ValueError(f"successes, n: got {successes}, {n}; expected whole numbers with 0 <= successes <= n")
    z = _z(confidence)
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (0.0 if successes == 0 else centre - half), (1.0 if successes == n else centre + half)


def _censored(times, observed) -> tuple[np.ndarray, np.ndarray]:
    times = np.asarray(times).reshape(-1)  # (n,)
    observed = np.asarray(observed, dtype=bool).reshape(-1)  # (n,)
    if len(times) != len(observed):
        raise ValueError(f"times, observed: got lengths {len(times)}, {len(observed)}; expected one flag per time")
    if not np.issubdtype(times.dtype, np.number) or not np.all(np.isfinite(times)):
        raise ValueError(f"times: got {times.tolist()}; expected finite numbers")
    return times, observed


class _ProductLimit(NamedTuple):
    event_times: np.ndarray  # (m,) distinct times with at least one event, increasing
    survival: np.ndarray  # (m,) S just after each event time: the exact product, rounded once to float64
    greenwood: np.ndarray  # (m,) sum over event times <= t of d / (n (n - d)); inf once S = 0


def _product_limit(times, observed) -> _ProductLimit:
    times, observed = _censored(times, observed)
    event_times, deaths = np.unique(times[observed], return_counts=True)  # (m,), (m,)
    # (m,) at risk at t: time >= t, so a seed censored at t still counts (events before censorings)
    at_risk = np.array([np.count_nonzero(times >= t) for t in event_times], dtype=np.int64)
    exact = list(accumulate((Fraction(int(n - d), int(n)) for n, d in zip(at_risk, deaths)), operator.mul))
    with np.errstate(divide="ignore"):
        greenwood = np.cumsum(deaths / (at_risk * (at_risk - deaths)))  # (m,)
    return _ProductLimit(event_times, np.array([float(s) for s in exact]), greenwood)


def kaplan_meier(times, observed) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan–Meier (product-limit) estimate of the survival function
    S(t) = P(T > t) from times (n,) and observed (n,) flags (False: censored,
    the event had not happened by that time). Returns event_times (m,), the
    distinct times with at least one event, increasing, and survival (m,),

        S(t_j) = prod_{i <= j} (1 − d_i / n_i),

    d_i the events at t_i and n_i the number at risk, those with time >= t_i.
    Ties: events come before censorings at the same time (a seed censored at
    t_i is still at risk at t_i), the usual convention. S is 1 before the
    first event time and constant between event times; no events give two
    empty arrays. The product is formed exactly (fractions) and rounded once,
    so an S of exactly 1/2 is 0.5, not 0.5000000000000001."""
    estimate = _product_limit(times, observed)
    return estimate.event_times, estimate.survival


class KMMedian(NamedTuple):
    """The Kaplan–Meier median and its confidence interval; median and high
    None where not reached (S does not drop far enough within the observed
    times), low then at most the budget (km_median)."""

    median: float | None
    low: float | None
    high: float | None


def km_median(times, observed, confidence: float = 0.95) -> KMMedian:
    """The median time, the smallest event time t with S(t) <= 1/2 (None
    when S never drops to 1/2: "not reached within the budget"; where S is
    exactly 1/2 over a step this is the step's start, where R's survival
    takes the middle of the flat and lifelines its end), and its
    Brookmeyer–Crowley interval: the times t at which the test of
    H0: S(t) = 1/2 accepts, on the complementary log-log scale with
    Greenwood's variance,

        |log(−log S(t)) − log(log 2)| <= z sqrt(V(t)) / |log S(t)|,
        V(t) = sum_{t_i <= t} d_i / (n_i (n_i − d_i))      (Var S ≈ S² V),

    i.e. 1/2 lies in the pointwise band [S^exp(+z√V/|log S|), S^exp(−z√V/|log S|)].
    The test never accepts where S = 1 (before the first event) or S = 0.
    low is the first event time from which it accepts; high is the event
    time at which the last step where it accepts ends, None when it still
    accepts at the last event time (the upper bound is not reached). Where
    it never accepts although S reaches 1/2 (S falls from 1 straight to 0,
    as when every seed gets there at one logged step: no variance to work
    with), the interval is that of the bands' own medians, the first event
    times at which the lower and the upper band are <= 1/2 (a point, there).
    A median not reached (S stays above 1/2 to the last time watched, the
    budget) is "> budget": median None, high None, and low the first event
    time at which the test accepts, or the budget (the largest time) where it
    never does, as when no seed reached: so low never rises as more seeds
    reach. All three None only with no times at all. Times come back as the
    type they went in as (int steps stay int)."""
    z = _z(confidence)
    estimate = _product_limit(times, observed)
    survival = estimate.survival
    with np.errstate(divide="ignore", invalid="ignore"):
        log_s = np.log(survival)  # (m,) < 0 after an event; -inf at S = 0
        spread = z * np.sqrt(estimate.greenwood) / np.abs(log_s)  # (m,) nan at S = 0
        lower_band = survival ** np.exp(spread)  # (m,)
        upper_band = survival ** np.exp(-spread)  # (m,)
    accepts = (survival > 0) & (lower_band <= 0.5) & (upper_band >= 0.5)  # (m,)
    event_times = estimate.event_times
    at_or_below_half = np.flatnonzero(survival <= 0.5)
    median = event_times[at_or_below_half[0]].item() if len(at_or_below_half) else None
    accepted = np.flatnonzero(accepts)
    times, _ = _censored(times, observed)
    watched = times.max().item() if len(times) else None  # the budget: the longest any seed was watched
    if median is None:
        # not reached: the median is > the budget. Its lower bound is where the test first accepts (an
        # event time, so <= the budget) or, where it never does (no seed, or too few, reached), the
        # budget itself; the upper bound is unbounded. More seeds reaching can only lower it.
        return KMMedian(None, event_times[accepted[0]].item() if len(accepted) else watched, None)
    if not len(accepted):
        # S crossed 1/2 in steps the test cannot see into (no variance on either side: every seed at
        # one logged step): the bands' own medians, the first times each is at or below 1/2 (0 where S is).
        lower_band, upper_band = (np.where(survival > 0, band, 0.0) for band in (lower_band, upper_band))
        return KMMedian(
            median,
            event_times[np.flatnonzero(lower_band <= 0.5)[0]].item(),
            event_times[np.flatnonzero(upper_band <= 0.5)[0]].item(),
        )
    end = accepted[-1] + 1
    high = event_times[end].item() if end < len(event_times) else None
    return KMMedian(median, event_times[accepted[0]].item(), high)


def bootstrap_interval(
    samples,
    statistic: Callable[..., np.ndarray],
    rng: np.random.Generator,
    n_resamples: int = 2000,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """The percentile bootstrap interval of statistic(samples): the
    (1 − confidence)/2 and (1 + confidence)/2 quantiles (numpy's linear
    interpolation) of the statistic over n_resamples resamples of the
    first axis (seeds) drawn with replacement. The statistic is a reduction
    over `axis`, the seeds' (np.mean, np.median), applied to every resample
    in one call. Deterministic for a given Generator state; a statistic
    that is NaN on any resample makes both bounds NaN."""
    samples = np.asarray(samples)  # (n, ...)
    _z(confidence)
    if samples.ndim == 0 or len(samples) == 0:
        raise ValueError("samples: got none; expected at least one sample along the first axis")
    if n_resamples < 1:
        raise ValueError(f"n_resamples: got {n_resamples}; expected at least 1")
    picks = rng.integers(0, len(samples), size=(n_resamples, len(samples)))  # (n_resamples, n)
    resamples = samples[picks]  # (n_resamples, n, ...)
    values = np.asarray(statistic(resamples, axis=1), dtype=np.float64)  # (n_resamples,)
    low, high = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


_CRITERION = re.compile(r"(max|min) ([A-Za-z_][A-Za-z0-9_]*)")
CRITERION_FORMS = "'max <name>' or 'min <name>', e.g. 'max success_rate', 'min median_time', 'min final_loss'"


def _parse_criteria(criteria: Sequence[str]) -> list[tuple[str, str]]:
    parsed = []
    for criterion in criteria:
        match = _CRITERION.fullmatch(criterion) if isinstance(criterion, str) else None
        if match is None:
            raise ValueError(f"selection criterion {criterion!r}: expected {CRITERION_FORMS}")
        parsed.append((match[1], match[2]))
    return parsed


def select(candidates: Sequence[Mapping[str, float | None]], criteria: Sequence[str]) -> int:
    """The index of the candidate chosen by the criteria, applied in order
    (lexicographically): each keeps, of the candidates still tied, those
    with the largest ('max <name>') or smallest ('min <name>') value of
    candidate[name]. None, NaN and a missing name count as worst (below
    every number, -inf included, for max; above every number for min);
    when every tied candidate's value is worst they all stay tied. Only
    exactly equal values tie; the ties left after the last criterion go to
    the first of them in candidate order (with no criteria, candidate 0).
    Raises ValueError naming a criterion that is not of the accepted form
    (CRITERION_FORMS) or whose name no candidate has, and on no candidates."""
    parsed = _parse_criteria(criteria)
    if not candidates:
        raise ValueError("candidates: got none; expected at least one to select from")
    for direction, name in parsed:
        if not any(name in candidate for candidate in candidates):
            known = sorted(set().union(*candidates))
            raise ValueError(
                f"selection criterion '{direction} {name}': no candidate has {name!r}; expected one of {known}"
            )
    tied = list(range(len(candidates)))
    for direction, name in parsed:
        values = {i: _number(candidates[i].get(name)) for i in tied}
        finite = [v for v in values.values() if not math.isnan(v)]
        if finite:
            best = max(finite) if direction == "max" else min(finite)
            tied = [i for i in tied if values[i] == best]
    return tied[0]


def _number(value) -> float:
    """value as a float, NaN for None."""
    return math.nan if value is None else float(value)


def lr_sensitivity(
    final_losses: Mapping[int, Mapping], initial_losses: Mapping[int, float], rates: Sequence, rng: np.random.Generator
) -> dict:
    """Wortsman et al.'s learning-rate sensitivity: for each seed run at every rate, with L0 its eval loss
    at initialisation and L* = min over the rates of min(final loss, L0), its best capped final loss,

        mean over the rates of min(final loss, L0) - L*

    (0: every rate as good as the best; a diverged seed counts as L0, so one diverged at every rate adds 0),
    then the mean over those seeds with
    a percentile-bootstrap 95% interval. final_losses: seed -> rate -> final loss."""
    per_seed = []
    for seed, by_rate in sorted(final_losses.items()):
        if len(by_rate) == len(rates) and seed in initial_losses:
            capped = [min(loss, initial_losses[seed]) for loss in by_rate.values()]
            per_seed.append(float(np.mean(capped) - min(capped)))  # diverged at every rate: 0, not -inf
    if not per_seed:
        return {"sensitivity": None, "low": None, "high": None, "seeds": 0, "rates": list(rates)}
    low, high = bootstrap_interval(np.array(per_seed), np.mean, rng)
    return {
        "sensitivity": float(np.mean(per_seed)),
        "low": float(low),
        "high": float(high),
        "seeds": len(per_seed),
        "rates": list(rates),
    }


# ---------------------------------------------------------------------------
# Exact tests (integer arithmetic: math.comb and fractions, rounded once)
# ---------------------------------------------------------------------------
def binomial_upper_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exact: sum_{i >= k} C(n, i) / 2^n
    (1.0 for k <= 0)."""
    if not (0 <= n and int(n) == n):
        raise ValueError(f"n: got {n}; expected a whole number >= 0")
    k = max(int(k), 0)
    return float(Fraction(sum(math.comb(n, i) for i in range(k, n + 1)), 2**n))


class Test(NamedTuple):
    """A one-sided test of "the arm is better": p its p-value, p_reverse that
    of the opposite claim; the counts it is on (by test)."""

    p: float
    p_reverse: float
    counts: dict


def mcnemar_exact(better: int, worse: int) -> Test:
    """The exact (conditional) McNemar test on paired outcomes: of the
    discordant pairs, `better` favour the arm and `worse` the other; under
    H0 each discordant pair goes either way with probability 1/2, so
    p = P(X >= better), X ~ Binomial(better + worse, 1/2). No discordant
    pair: p = 1 both ways."""
    n = better + worse
    return Test(binomial_upper_tail(better, n), binomial_upper_tail(worse, n), {"better": better, "worse": worse})


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> Test:
    """Fisher's exact test, one-sided, that arm 1's rate (k1 of n1) is higher
    than arm 2's (k2 of n2): with the margins fixed, k1 is hypergeometric and
    p = P(K1 >= k1) = sum_{i >= k1} C(n1, i) C(n2, k - i) / C(n1 + n2, k),
    k = k1 + k2; p_reverse = P(K1 <= k1)."""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"k1, n1, k2, n2: got {k1}, {n1}, {k2}, {n2}; expected 0 <= k <= n for each arm")
    k, total = k1 + k2, math.comb(n1 + n2, k1 + k2)
    terms = {i: math.comb(n1, i) * math.comb(n2, k - i) for i in range(max(0, k - n2), min(k, n1) + 1)}
    upper = sum(v for i, v in terms.items() if i >= k1)
    lower = sum(v for i, v in terms.items() if i <= k1)
    return Test(float(Fraction(upper, total)), float(Fraction(lower, total)), {"k1": k1, "n1": n1, "k2": k2, "n2": n2})


def censored_order(mine: tuple[float, bool], theirs: tuple[float, bool]) -> int | None:
    """Which of two censored times (time, observed) is earlier: -1 mine, +1
    theirs, 0 a tie (both observed at one time), None where the order is not
    known (both censored, or one censored before the other's event). Censored
    at t is "not reached by t": an event at t itself is the earlier one."""
    (t1, o1), (t2, o2) = mine, theirs
    if o1 and o2:
        return (t1 > t2) - (t1 < t2)
    if o1 and not o2:
        return -1 if t1 <= t2 else None
    if o2 and not o1:
        return 1 if t2 <= t1 else None
    return None


def sign_test_censored(pairs) -> Test:
    """A sign test of "the arm's time is shorter" on paired censored times
    ((mine, theirs), each (time, observed)): the pairs whose order is known
    (censored_order) and not tied count, each earlier for the arm with
    probability 1/2 under H0; p = P(X >= earlier), X ~ Binomial(known, 1/2)."""
    orders = [censored_order(a, b) for a, b in pairs]
    earlier, later = orders.count(-1), orders.count(1)
    return Test(
        binomial_upper_tail(earlier, earlier + later),
        binomial_upper_tail(later, earlier + later),
        {"earlier": earlier, "later": later, "tied": orders.count(0), "unknown": orders.count(None)},
    )


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """p1 − p2 with Newcombe's hybrid score interval (his method 10, 1998),
    from the two Wilson intervals (l_i, u_i):
        low  = d − sqrt((p1 − l1)² + (u2 − p2)²),  high = d + sqrt((u1 − p1)² + (p2 − l2)²).
    For paired arms it ignores the pairing; with the positive correlation
    of one seed's runs that makes it wider, not narrower."""
    if not (n1 and n2):
        return math.nan, -1.0, 1.0
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson_interval(k1, n1, confidence), wilson_interval(k2, n2, confidence)
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def holm_steps(p_values: Sequence[float]) -> list[tuple[float, float]]:
    """Holm's step-down, per p-value: (multiplier, floor), its adjusted p being
    max(floor, min(1, multiplier p)): the i-th smallest of m is multiplied by
    m − i + 1 and floored at the adjusted p of the one before it. NaN entries
    (no test) get (NaN, NaN) and do not count in m."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m, out, running = len(indexed), [(math.nan, math.nan)] * len(p_values), 0.0
    for rank, (p, i) in enumerate(indexed):
        out[i] = (float(m - rank), running)
        running = max(running, min(1.0, (m - rank) * p))
    return out


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (holm_steps); reject those <= alpha. NaN stays NaN."""
    return [
        max(floor, min(1.0, multiplier * p)) if not math.isnan(p) else math.nan
        for p, (multiplier, floor) in zip(p_values, holm_steps(p_values))
    ]
