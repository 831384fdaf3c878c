"""attn.outcomes on synthetic eval curves of every class and every edge case
its docstring names."""

import math

import numpy as np
import pytest

from attn.outcomes import (
    DIVERGED,
    LEARNED,
    LEARNED_THEN_LOST,
    OUTCOMES,
    PLATEAU_FRACTION,
    SLOW,
    STALLED,
    THRESHOLD,
    CensoredTime,
    classify,
    definitions,
    of_run,
)

BUDGET = 500
STEPS = np.arange(0, BUDGET + 1, 50)  # (11,) logged steps
CLASSES = 16
CHANCE = 1 / CLASSES
CHANCE_LOSS = math.log(CLASSES)  # 2.77 nats: L_c
PLATEAU = 1.8  # nats: the no-retrieval level L_nr of a retrieval task, the lower plateau
PLATEAU_LEVEL = PLATEAU_FRACTION * PLATEAU
NAN = math.nan


def run(accuracy, loss, *, diverged=False, steps=STEPS, **overrides):
    """classify() on one curve, with this module's retrieval task."""
    settings = dict(diverged=diverged, budget=BUDGET, chance_loss=CHANCE_LOSS, no_retrieval_loss=PLATEAU)
    return classify(steps, accuracy, loss, **(settings | overrides))


def ramp(start, end, first, last):
    """Per logged step: `start` until step `first`, linear to `end` at step `last`, then `end`."""
    return np.interp(STEPS, [first, last], [start, end])


LEARNING_LOSS = ramp(2.7, 0.01, 0, 200)
REACHING_ACCURACY = ramp(CHANCE, 1.0, 0, 200)  # first >= 0.99 at step 200


def test_a_learner_that_holds_it_is_learned():
    outcome = run(REACHING_ACCURACY, LEARNING_LOSS)
    assert outcome.outcome == LEARNED
    assert outcome.reached_step == 200
    assert outcome.left_plateau_step == STEPS[LEARNING_LOSS < PLATEAU_LEVEL][0] == 100
    assert outcome.time_to_threshold == CensoredTime(200, True)
    assert (outcome.best_accuracy, outcome.final_accuracy) == (1.0, 1.0)
    assert outcome.best_loss == outcome.final_loss == pytest.approx(0.01)
    assert not outcome.diverged_after_reaching and outcome.sat_at is None


def test_a_learner_that_ends_below_the_threshold_learned_then_lost():
    accuracy = np.where(STEPS >= 400, 0.5, REACHING_ACCURACY)
    loss = np.where(STEPS >= 400, 2.0, LEARNING_LOSS)
    outcome = run(accuracy, loss)
    assert outcome.outcome == LEARNED_THEN_LOST
    assert outcome.time_to_threshold == CensoredTime(200, True)
    assert (outcome.best_accuracy, outcome.final_accuracy, outcome.final_loss) == (1.0, 0.5, 2.0)


def test_a_final_accuracy_that_is_not_finite_does_not_hold_the_threshold():
    accuracy = np.where(STEPS == BUDGET, NAN, REACHING_ACCURACY)
    outcome = run(accuracy, LEARNING_LOSS)
    assert outcome.outcome == LEARNED_THEN_LOST and outcome.final_accuracy is None


def test_accuracy_above_chance_with_the_loss_on_the_plateau_is_stalled():
    """Issue 45: accuracy touching 0.15-0.26 by noise, with the loss near chance, is not leaving the plateau."""
    accuracy = ramp(CHANCE, 0.26, 100, 400)
    outcome = run(accuracy, np.full(len(STEPS), 2.71))
    assert (outcome.outcome, outcome.sat_at) == (STALLED, "chance")
    assert outcome.left_plateau_step is None and outcome.reached_step is None
    assert outcome.time_to_threshold == CensoredTime(BUDGET, False)


def test_loss_below_the_lower_plateau_with_low_accuracy_is_slow():
    loss = ramp(2.7, 1.5, 0, 300)
    outcome = run(np.full(len(STEPS), CHANCE), loss)
    assert (outcome.outcome, outcome.sat_at) == (SLOW, None)
    assert outcome.left_plateau_step == STEPS[loss < PLATEAU_LEVEL][0]


def test_a_run_sitting_at_the_no_retrieval_plateau_is_stalled_there():
    """Left chance, never got below 0.9 L_nr: it knows the values in the context, retrieves nothing."""
    outcome = run(np.full(len(STEPS), 0.257), ramp(CHANCE_LOSS, PLATEAU, 0, 100))
    assert (outcome.outcome, outcome.sat_at, outcome.slow_kind) == (STALLED, "no-retrieval", None)
    assert outcome.said() == "stalled (loss at the no-retrieval plateau)"


def test_without_a_no_retrieval_level_the_plateau_is_chance():
    """A copy task has no L_nr: leaving is judged against 0.9 L_c."""
    loss = np.full(len(STEPS), 2.0)  # below 0.9 L_c = 2.49, above 0.9 L_nr = 1.62
    assert run(np.full(len(STEPS), CHANCE), loss, no_retrieval_loss=None).outcome == SLOW
    assert run(np.full(len(STEPS), CHANCE), loss).outcome == STALLED


def test_a_run_that_never_leaves_the_plateau_is_stalled():
    rng = np.random.default_rng(0)
    accuracy = CHANCE + rng.uniform(-0.02, 0.02, size=len(STEPS))
    loss = 2.7 + rng.uniform(-0.05, 0.05, size=len(STEPS))
    outcome = run(accuracy, loss)
    assert outcome.outcome == STALLED
    assert outcome.left_plateau_step is None and outcome.reached_step is None
    assert outcome.best_accuracy == accuracy.max() and outcome.best_loss == loss.min()
    assert outcome.time_to_threshold == CensoredTime(BUDGET, False)


def test_the_threshold_is_inclusive_and_the_plateau_bar_strict():
    exactly = np.where(STEPS == 150, THRESHOLD, REACHING_ACCURACY)
    assert run(exactly, LEARNING_LOSS).reached_step == 150
    assert run(np.full(len(STEPS), CHANCE), np.full(len(STEPS), PLATEAU_LEVEL)).outcome == STALLED
    just_below = run(np.full(len(STEPS), CHANCE), np.full(len(STEPS), np.nextafter(PLATEAU_LEVEL, 0)))
    assert just_below.outcome == SLOW


def test_a_run_that_diverges_after_reaching():
    accuracy = np.where(STEPS >= 450, NAN, REACHING_ACCURACY)
    loss = np.where(STEPS >= 450, NAN, LEARNING_LOSS)
    outcome = run(accuracy, loss, diverged=True)
    assert outcome.outcome == DIVERGED and outcome.diverged_after_reaching
    assert outcome.reached_step == 200 and outcome.time_to_threshold == CensoredTime(200, True)
    assert outcome.final_accuracy is None and outcome.final_loss is None
    assert outcome.best_accuracy == 1.0


def test_a_run_that_diverges_before_reaching_is_censored_at_the_budget():
    accuracy = np.where(STEPS >= 150, NAN, ramp(CHANCE, 0.5, 0, 100))
    loss = np.where(STEPS >= 150, math.inf, ramp(2.7, 1.2, 0, 100))  # inf counts as NaN
    outcome = run(accuracy, loss, diverged=True)
    assert outcome.outcome == DIVERGED and not outcome.diverged_after_reaching
    assert outcome.time_to_threshold == CensoredTime(BUDGET, False)
    assert outcome.best_loss == pytest.approx(1.2) and outcome.final_loss is None
    assert outcome.sat_at is None


@pytest.mark.parametrize("diverged, expected", [(False, STALLED), (True, DIVERGED)])
def test_no_records_and_no_finite_values(diverged, expected):
    nothing = run([], [], steps=[], diverged=diverged)
    only_nan = run(np.full(len(STEPS), NAN), np.full(len(STEPS), NAN), diverged=diverged)
    for outcome in (nothing, only_nan):
        assert outcome.outcome == expected
        assert outcome.reached_step is outcome.left_plateau_step is None
        assert outcome.best_accuracy is outcome.best_loss is outcome.final_accuracy is outcome.final_loss is None
        assert outcome.time_to_threshold == CensoredTime(BUDGET, False)


def test_without_a_finite_loss_or_plateau_level_nothing_leaves():
    assert run(ramp(CHANCE, 0.5, 100, 400), np.full(len(STEPS), NAN)).outcome == STALLED
    unknown = run(np.full(len(STEPS), CHANCE), np.full(len(STEPS), 0.5), chance_loss=NAN, no_retrieval_loss=None)
    assert (unknown.outcome, unknown.sat_at) == (STALLED, "chance")


def test_every_class_is_reachable_and_listed_once():
    seen = {
        run(REACHING_ACCURACY, LEARNING_LOSS).outcome,
        run(np.where(STEPS >= 400, 0.5, REACHING_ACCURACY), LEARNING_LOSS).outcome,
        run(ramp(CHANCE, 0.5, 100, 400), np.full(len(STEPS), 1.0)).outcome,
        run(np.full(len(STEPS), CHANCE), np.full(len(STEPS), 2.7)).outcome,
        run(REACHING_ACCURACY, LEARNING_LOSS, diverged=True).outcome,
    }
    assert seen == set(OUTCOMES) and len(OUTCOMES) == len(set(OUTCOMES)) == 5


def test_the_threshold_and_plateau_fraction_are_parameters():
    assert run(ramp(CHANCE, 0.96, 0, 200), LEARNING_LOSS).outcome == SLOW
    assert run(ramp(CHANCE, 0.96, 0, 200), LEARNING_LOSS, threshold=0.95).outcome == LEARNED
    flat_accuracy, loss = np.full(len(STEPS), 0.2), np.full(len(STEPS), 1.7)
    assert run(flat_accuracy, loss).outcome == STALLED  # 1.7 >= 0.9 x 1.8
    assert run(flat_accuracy, loss, plateau_fraction=1.0).outcome == SLOW


@pytest.mark.parametrize(
    "steps, accuracy, loss, field",
    [
        (STEPS[:-1], REACHING_ACCURACY, LEARNING_LOSS, "lengths"),
        (STEPS[::-1], REACHING_ACCURACY, LEARNING_LOSS, "increasing"),
        (STEPS, REACHING_ACCURACY, LEARNING_LOSS[:-1], "lengths"),
    ],
)
def test_inconsistent_curves_are_refused(steps, accuracy, loss, field):
    with pytest.raises(ValueError, match=field):
        run(accuracy, loss, steps=steps)


def test_definitions_name_every_class_with_the_numbers_in_force():
    text = definitions()
    assert all(repr(name) in text for name in OUTCOMES)
    assert f"{THRESHOLD:g}" in text and f"{PLATEAU_FRACTION:g} L" in text and "\n" not in text
    other = definitions(0.95, 0.8)
    assert "0.95" in other and "0.8 L" in other and f"{THRESHOLD:g}" not in other
    shared = definitions(chance_loss=CHANCE_LOSS, no_retrieval_loss=PLATEAU)
    assert f"{CHANCE_LOSS:.3g}" in shared and f"{PLATEAU:.3g}" in shared


def test_a_run_names_its_outcome_from_its_records_and_summary():
    records = [
        {"step": int(s), "eval_accuracy": a, "eval_loss": v} for s, a, v in zip(STEPS, REACHING_ACCURACY, LEARNING_LOSS)
    ]
    summary = {"status": "completed", "steps": BUDGET, "references": {"chance": CHANCE_LOSS, "no_retrieval": PLATEAU}}
    assert of_run(records, summary).outcome == LEARNED
    assert of_run(records, summary | {"status": "running"}) is None
    broken = records[:3] + [{"step": 200, "eval_accuracy": None, "eval_loss": "nan"}]
    assert of_run(broken, summary | {"status": "diverged"}).outcome == DIVERGED
    stalled = [{"step": int(s), "eval_accuracy": CHANCE, "eval_loss": 2.7} for s in STEPS]
    assert of_run(stalled, summary).said() == "stalled (loss at chance)"


def test_a_seed_that_never_left_chance_is_stalled_at_the_chance_level():
    outcome = run(np.full(len(STEPS), CHANCE), np.full(len(STEPS), CHANCE_LOSS))
    assert (outcome.outcome, outcome.sat_at, outcome.slow_kind) == (STALLED, "chance", None)


def test_a_diverged_seed_sat_at_no_level():
    outcome = run(np.full(len(STEPS), CHANCE), np.full(len(STEPS), CHANCE_LOSS), diverged=True)
    assert (outcome.outcome, outcome.sat_at) == (DIVERGED, None)


@pytest.mark.parametrize(
    "best_accuracy, final_loss, kind",
    [
        (0.988, 0.05, "near"),  # 253 of 256: near, whatever its loss did
        (0.7, 0.9, "unstable"),  # best loss 0.3, then rose to 3x it (> UNSTABLE_FACTOR)
        (0.7, 0.5, "far"),  # rose less than the factor
    ],
)
def test_a_slow_seed_is_near_unstable_or_far(best_accuracy, final_loss, kind):
    accuracy = np.where(STEPS == 250, best_accuracy, 0.5)
    loss = np.where(STEPS < 250, 1.0, np.where(STEPS == 250, 0.3, final_loss))
    outcome = run(accuracy, loss)
    assert (outcome.outcome, outcome.slow_kind) == (SLOW, kind)
    assert outcome.said() == f"slow ({kind})"


def test_the_definitions_name_the_slow_kinds_and_the_plateau_levels():
    text = definitions()
    assert "'near' if its best accuracy was >= 0.95" in text and "'unstable' if its final loss was more than 2" in text
    assert "chance level" in text and "no-retrieval level" in text
