"""attn.analysis.stats against closed forms, published values, hand computations and
brute-force references."""

import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
from helpers import facts_in

from attn.analysis import stats
from attn.analysis.stats import KMMedian, bootstrap_interval, kaplan_meier, km_median, select, wilson_interval

Z95 = NormalDist().inv_cdf(0.975)


def wilson_by_quadratic(successes: int, n: int, z: float) -> tuple[float, float]:
    """The Wilson bounds as the two roots p of the score test's boundary
    (p̂ − p)² = z² p (1 − p) / n, i.e. (1 + z²/n) p² − (2p̂ + z²/n) p + p̂² = 0."""
    p_hat = successes / n
    a, b, c = 1 + z * z / n, -(2 * p_hat + z * z / n), p_hat * p_hat
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


@pytest.mark.parametrize("successes, n", [(4, 5), (0, 10), (10, 10), (7, 20)])
def test_wilson_is_the_score_test_inversion(successes, n):
    assert wilson_interval(successes, n) == pytest.approx(wilson_by_quadratic(successes, n, Z95), abs=1e-12)
    z80 = NormalDist().inv_cdf(0.9)
    assert wilson_interval(successes, n, 0.8) == pytest.approx(wilson_by_quadratic(successes, n, z80), abs=1e-12)


@pytest.mark.parametrize(
    "successes, n, low, high",
    [
        # R. G. Newcombe, "Two-sided confidence intervals for the single proportion: comparison of seven
        # methods", Statistics in Medicine 17 (1998) 857-872: the worked examples, 95% score interval
        # without continuity correction, published to four decimals.
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_published_values(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=5e-5)


def test_wilson_ends_are_exact_and_no_trials_is_no_evidence():
    assert wilson_interval(0, 7)[0] == 0.0
    assert wilson_interval(7, 7)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("n", [1, 2, 5, 17, 40])
def test_wilson_is_symmetric_and_monotone_in_successes(n):
    bounds = np.array([wilson_interval(k, n) for k in range(n + 1)])  # (n + 1, 2)
    np.testing.assert_allclose(bounds[:, 0], 1 - bounds[::-1, 1], atol=1e-12)
    assert np.all(np.diff(bounds, axis=0) > 0)
    assert np.all((bounds[:, 0] < np.arange(n + 1) / n) | (bounds[:, 0] == 0))


@pytest.mark.parametrize("confidence", [0.8, 0.95])
def test_wilson_covers_about_as_often_as_it_says(confidence):
    rng = np.random.default_rng(0)
    n, draws = 50, 4000
    for p in (0.2, 0.5):
        covers = np.array([low <= p <= high for low, high in (wilson_interval(k, n, confidence) for k in range(n + 1))])
        coverage = covers[rng.binomial(n, p, size=draws)].mean()
        assert abs(coverage - confidence) < 0.03, (p, coverage)


@pytest.mark.parametrize(
    "successes, n, confidence", [(3, 2, 0.95), (-1, 4, 0.95), (1.5, 4, 0.95), (1, 4, 1.0), (1, 4, 0.0)]
)
def test_wilson_rejects_bad_input(successes, n, confidence):
    with pytest.raises(ValueError):
        wilson_interval(successes, n, confidence)


def test_kaplan_meier_by_hand_with_censoring_and_ties():
    times = [1, 2, 2, 2, 3, 4, 5, 5]
    observed = [1, 1, 1, 0, 0, 1, 1, 0]
    # t=1: 8 at risk, 1 event -> 7/8; t=2: 7 at risk (the seed censored at 2 still counts: events before
    # censorings), 2 events -> 7/8 * 5/7; t=4: 3 at risk, 1 event -> * 2/3; t=5: 2 at risk, 1 event -> * 1/2.
    # (Censorings first would give 7/8 * 4/6 at t=2.)
    expected = [
        Fraction(7, 8),
        Fraction(7, 8) * Fraction(5, 7),
        Fraction(5, 8) * Fraction(2, 3),
        Fraction(5, 12) * Fraction(1, 2),
    ]
    event_times, survival = kaplan_meier(times, observed)
    assert event_times.tolist() == [1, 2, 4, 5]
    np.testing.assert_allclose(survival, [float(s) for s in expected], rtol=1e-15)
    assert km_median(times, observed).median == 4  # S(2) = 5/8 > 1/2 >= S(4) = 5/12


def redistribute_to_the_right(times, observed) -> dict:
    """Efron's construction of the Kaplan–Meier estimate, independent of the
    product formula: every seed starts with mass 1/n; in time order (events
    before censorings at a tie) a censored seed hands its mass in equal
    parts to every seed after it. S(t) = 1 − the mass of the events at <= t."""
    order = sorted(range(len(times)), key=lambda i: (times[i], not observed[i]))
    mass = {i: Fraction(1, len(times)) for i in order}
    for position, i in enumerate(order):
        later = order[position + 1 :]
        if not observed[i] and later:
            for j in later:
                mass[j] += mass[i] / len(later)
            mass[i] = Fraction(0)
    return {
        t: 1 - sum(mass[i] for i in order if observed[i] and times[i] <= t)
        for t in sorted({times[i] for i in order if observed[i]})
    }


def test_kaplan_meier_matches_redistribution_to_the_right():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(1, 15))
        times = rng.integers(1, 8, size=n).tolist()  # few distinct values: many ties
        observed = (rng.random(n) < 0.6).tolist()
        reference = redistribute_to_the_right(times, observed)
        event_times, survival = kaplan_meier(times, observed)
        assert event_times.tolist() == list(reference)
        np.testing.assert_allclose(survival, [float(s) for s in reference.values()], atol=1e-12)


def test_kaplan_meier_of_nothing_and_mismatched_input():
    event_times, survival = kaplan_meier([], [])
    assert len(event_times) == len(survival) == 0
    assert km_median([], []) == (None, None, None)
    with pytest.raises(ValueError, match="lengths"):
        kaplan_meier([1, 2], [True])
    with pytest.raises(ValueError, match="finite"):
        kaplan_meier([1, math.nan], [True, True])


def test_km_median_with_seeds_censored_at_the_budget():
    budget = 100
    # S = 4/5, 3/5, 2/5 after the events at 10, 20, 30; the two seeds that never got there are censored at the budget
    assert km_median([10, 20, 30, budget, budget], [1, 1, 1, 0, 0]).median == 30


def test_km_median_not_reached_within_the_budget():
    budget = 100
    result = km_median([10, budget, budget, budget], [1, 0, 0, 0])  # S = 3/4 at most
    assert result.median is None and result.high is None
    assert km_median([budget] * 3, [0] * 3) == (None, budget, None)  # "> budget": the budget its lower bound


def test_a_median_not_reached_is_above_the_budget_and_monotone_in_the_seeds_that_reach():
    """Issue 24: with no seed reaching, the median is "> budget" (lower bound the
    budget, upper unbounded), not [0, inf]; one of 10 reaching at 700 lowers the
    bound to at most 700; 10 of 10 give a finite median; and the lower bound never
    rises as more of 10 seeds reach (at steps 700, 710, ...)."""
    budget = 1000
    assert km_median([budget] * 4, [False] * 4) == KMMedian(None, budget, None)
    one = km_median([700] + [budget] * 9, [True] + [False] * 9)
    assert one.median is None and one.high is None and one.low <= 700
    every = km_median([700 + 10 * i for i in range(10)], [True] * 10)
    assert every.median is not None and every.high is not None and every.low <= every.median <= every.high
    lows = []
    for k in range(11):
        times = [700 + 10 * i for i in range(k)] + [budget] * (10 - k)
        result = km_median(times, [True] * k + [False] * (10 - k))
        assert result.low is not None and result.low <= budget
        lows.append(result.low)
    assert lows == sorted(lows, reverse=True) and lows[0] == budget


def test_km_median_at_exactly_one_half_is_decided_exactly():
    assert km_median([1, 2, 3, 4], [1] * 4).median == 2  # S(2) = 1/2
    n = 24  # the float product (1 - 1/24)(1 - 1/23)...(1 - 1/13) is 0.5000000000000001, not 1/2
    assert km_median(list(range(1, n + 1)), [1] * n).median == n // 2


def brookmeyer_crowley_on_a_grid(times, observed, z):
    """The times t in 0..max(times) at which the test of S(t) = 1/2 accepts,
    |log(−log S) − log(log 2)| <= z sqrt(V) / |log S|, with S and Greenwood's
    V computed afresh at each t from the seeds; returns (first accepted t,
    the step at which the last accepted run ends, None if at the end)."""
    accepted = []
    for t in range(max(times) + 1):
        s, v = 1.0, 0.0
        for u in sorted({time for time, seen in zip(times, observed) if seen and time <= t}):
            at_risk = sum(time >= u for time in times)
            events = sum(seen and time == u for time, seen in zip(times, observed))
            s *= 1 - events / at_risk
            v += events / (at_risk * (at_risk - events)) if at_risk > events else math.inf
        if 0 < s < 1 and abs(math.log(-math.log(s)) - math.log(math.log(2))) <= z * math.sqrt(v) / abs(math.log(s)):
            accepted.append(t)
    if not accepted:
        return None, None
    return accepted[0], None if accepted[-1] == max(times) else accepted[-1] + 1


def test_km_median_interval_matches_a_grid_search_and_holds_the_median():
    rng = np.random.default_rng(2)
    checked = 0
    for _ in range(40):
        n = int(rng.integers(3, 25))
        times = rng.integers(1, 30, size=n).tolist()
        observed = (rng.random(n) < 0.75).tolist()
        result = km_median(times, observed)
        assert (result.low, result.high) == brookmeyer_crowley_on_a_grid(times, observed, Z95)
        if result.median is not None and result.low is not None:
            assert result.low <= result.median
            assert result.high is None or result.median <= result.high
            checked += 1
        narrower = km_median(times, observed, confidence=0.5)
        if narrower.low is not None and result.low is not None:
            assert result.low <= narrower.low
    assert checked > 20


def test_km_median_interval_by_hand():
    # Three events, at 10, 20, 30: S = 2/3, 1/3, 0, median 20. Greenwood: V(10) = 1/(3*2), V(20) = 1/6 + 1/(2*1).
    # At 10 the band's lower end (2/3)^exp(z sqrt(1/6) / log(3/2)) ~ 0.05 is below 1/2: the interval starts there;
    # at 20 its upper end (1/3)^exp(-z sqrt(2/3) / log 3) ~ 0.77 is above 1/2; at 30 S = 0 rejects: it ends at 30.
    assert (2 / 3) ** math.exp(Z95 * math.sqrt(1 / 6) / math.log(3 / 2)) < 0.5
    assert (1 / 3) ** math.exp(-Z95 * math.sqrt(2 / 3) / math.log(3)) > 0.5
    assert km_median([10, 20, 30], [1, 1, 1]) == (20, 10, 30)


def test_bootstrap_is_deterministic_for_a_seeded_generator():
    samples = np.random.default_rng(3).normal(size=30)
    first = bootstrap_interval(samples, np.mean, np.random.default_rng(7))
    assert first == bootstrap_interval(samples, np.mean, np.random.default_rng(7))
    assert first != bootstrap_interval(samples, np.mean, np.random.default_rng(8))


@pytest.mark.parametrize("statistic", [np.mean, np.median])
def test_bootstrap_of_every_resample_in_one_call_is_bit_for_bit_the_statistic_of_each(statistic):
    samples = np.random.default_rng(3).lognormal(size=17)
    samples[[2, 9]] = np.inf  # a diverged seed's final loss
    picks = np.random.default_rng(7).integers(0, len(samples), size=(500, len(samples)))
    values = np.array([statistic(samples[pick]) for pick in picks])
    with np.errstate(invalid="ignore"):
        expected = tuple(float(q) for q in np.quantile(values, [(1 - 0.95) / 2, (1 + 0.95) / 2]))
        interval = bootstrap_interval(samples, statistic, np.random.default_rng(7), n_resamples=500)
    assert np.array_equal(interval, expected, equal_nan=True)  # the mean's upper bound: NaN (inf - inf)


def test_bootstrap_interval_holds_the_statistic_and_shrinks_with_more_seeds():
    rng = np.random.default_rng(4)
    widths = []
    for n in (25, 400):
        samples = rng.normal(size=n)
        low, high = bootstrap_interval(samples, np.median, rng)
        assert low <= np.median(samples) <= high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2  # the width goes as 1/sqrt(n): a quarter


def test_bootstrap_quantile_levels_on_a_known_resampling_distribution():
    # The mean of two resampled values from [0, 1] is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4.
    rng = np.random.default_rng(5)
    assert bootstrap_interval([0.0, 1.0], np.mean, rng, n_resamples=4000, confidence=0.4) == (0.5, 0.5)
    assert bootstrap_interval([0.0, 1.0], np.mean, rng, n_resamples=4000, confidence=0.6) == (0.0, 1.0)


def test_bootstrap_resamples_whole_seeds():
    seeds = np.arange(10.0)
    samples = np.stack([seeds, 2 * seeds], axis=1)  # (10, 2): a seed's two figures travel together
    rng = np.random.default_rng(6)
    assert bootstrap_interval(samples, lambda s, axis: np.sum(s[..., 1] - 2 * s[..., 0], axis=axis), rng) == (0.0, 0.0)


def test_bootstrap_nan_statistic_and_bad_input():
    rng = np.random.default_rng(7)
    low, high = bootstrap_interval([1.0, math.nan], np.mean, rng)
    assert math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="samples"):
        bootstrap_interval([], np.mean, rng)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([1.0], np.mean, rng, confidence=95)


def test_select_by_each_direction():
    candidates = [
        {"success_rate": 0.6, "final_loss": 0.3},
        {"success_rate": 1.0, "final_loss": 0.5},
        {"success_rate": 0.8, "final_loss": 0.1},
    ]
    assert select(candidates, ["max success_rate"]) == 1
    assert select(candidates, ["min final_loss"]) == 2


def test_select_counts_none_nan_and_missing_as_worst():
    assert select([{"x": None}, {"x": -math.inf}], ["max x"]) == 1
    assert select([{"x": math.nan}, {"x": math.inf}], ["min x"]) == 1
    assert select([{}, {"x": 5.0}], ["min x"]) == 1
    assert select([{"x": None, "y": 2.0}, {"x": math.nan, "y": 1.0}], ["max x", "min y"]) == 1  # all worst: tied


def test_select_passes_exact_ties_on_and_gives_the_rest_to_the_first():
    candidates = [
        {"success_rate": 1.0, "median_time": 50.0},
        {"success_rate": 0.8, "median_time": 10.0},
        {"success_rate": 1.0, "median_time": 40.0},
        {"success_rate": 1.0, "median_time": 40.0},
    ]
    assert select(candidates, ["max success_rate", "min median_time"]) == 2
    assert select(candidates, ["max success_rate"]) == 0
    assert select([{"x": 1.0}, {"x": 1.0 + 1e-12}], ["min x"]) == 0  # only exact equality ties
    assert select(candidates, []) == 0


@pytest.mark.parametrize("criterion", ["maximum success_rate", "max", "max success rate", "MAX x", " max x", 3])
def test_select_names_a_malformed_criterion_and_the_accepted_forms(criterion):
    with pytest.raises(ValueError) as error:
        select([{"x": 1.0}], ["min x", criterion])
    assert repr(criterion) in str(error.value)
    assert "'max <name>' or 'min <name>'" in str(error.value)


def test_select_names_an_unknown_key_and_needs_candidates():
    with pytest.raises(ValueError) as info:
        select([{"median_time": 1.0, "final_loss": 2.0}], ["min median_tim"])
    assert facts_in(str(info.value), "'min median_tim'", "'final_loss'", "'median_time'")
    with pytest.raises(ValueError, match="candidates"):
        select([], ["min x"])


def test_km_median_interval_where_every_seed_arrives_at_one_step_is_that_step():
    """S falls from 1 to 0 (or past 1/2 with no variance left to test against)
    at one logged step: the interval is the bands' medians, a point there."""
    assert km_median([50] * 10, [True] * 10) == KMMedian(50, 50, 50)
    median, low, high = km_median([50] * 9 + [1500], [True] * 9 + [False])
    assert (median, low, high) == (50, 50, 50)
    assert km_median([7, 7, 9], [False, False, False]) == KMMedian(None, 9, None)


def test_lr_sensitivity_is_the_mean_excess_over_each_seeds_best_with_a_diverged_rate_counted_at_l0():
    """Wortsman et al.: seed 0: mean(0.2, 0.5) - 0.2 = 0.15; seed 1 diverged at 0.3: mean(0.4, L0) - 0.4 = 0.95;
    seed 2 diverged at every rate: L0 at each, its best L0 too: 0 (not -inf)."""
    finals = {0: {0.1: 0.2, 0.3: 0.5}, 1: {0.1: 0.4, 0.3: math.inf}, 2: {0.1: math.inf, 0.3: math.inf}}
    result = stats.lr_sensitivity(finals, dict.fromkeys(finals, 2.3), [0.1, 0.3], np.random.default_rng(0))
    assert result["seeds"] == 3 and result["sensitivity"] == pytest.approx((0.15 + 0.95 + 0.0) / 3)
    assert 0 <= result["low"] <= result["sensitivity"] <= result["high"]
