"""The outcome class of one seed's run, from its logged eval curve: one
definition for every report, figure and README.

Inputs are arrays and numbers only (no records, no run directories): the
logged steps, eval accuracy and eval loss at those steps (NaN where a value
is non-finite or missing), whether the run diverged, its budget (train.steps),
the plateau level L (the loss a seed has to get below to have left the
plateau: reports use chance, ln C) and chance accuracy 1/C. A run that did not diverge is taken as completed: the
caller classifies finished runs only.

Per logged step, with T the accuracy threshold, b = ACCURACY_BAR_FACTOR / C
the low accuracy bar and f = PLATEAU_FRACTION:

    reached           eval accuracy >= T
    left the plateau  eval accuracy > b  or  eval loss < f L

A NaN is evidence of nothing: a NaN accuracy neither reaches nor leaves, a
NaN loss never counts as below f L, so where the loss is NaN leaving the
plateau is judged by the accuracy alone (likewise with a NaN plateau level
L: by accuracy at every step). Any non-finite input value (inf too) is
treated as NaN.

The classes, checked in this order:

    diverged            the run ended on a non-finite value (the caller's
                        `diverged`); `reached_step` says whether it had
                        reached T before (`diverged_after_reaching`)
    learned             reached T, and the final eval accuracy is >= T
    learned then lost   reached T, and the final eval accuracy is < T or NaN
    slow                never reached T, left the plateau at some step; its
                        slow_kind says what it did: `near` (best accuracy
                        >= NEAR_ACCURACY), else `unstable` (final loss more
                        than UNSTABLE_FACTOR times its best: it rose after
                        its best), else `far`
    stalled             never reached T, never left the plateau: at every
                        logged step accuracy <= b and loss >= f L (or NaN)

Reports pass L = chance, ln C (attn.analysis.results): "stalled" means never
left chance. Given the task's no-retrieval level L_nr as well, a seed that
never reached T says which plateau it sat at (sat_at): `chance` if stalled,
`no-retrieval` if it left chance but its best loss stayed >= f L_nr (a model
that has learned the value statistics but retrieves nothing), else None.

`final` is the last logged record's value (None where it is NaN), `best`
the max accuracy / min loss over the finite values. Reaching is checked
before leaving, so a seed that reached T is learned or learned then lost
even where T <= b (a two-class task: b = 1), and `left_plateau_step` may
then be None.

Edge cases, as the rules above make them: a run with no records, or only
NaN values, has reached nothing and left nothing: `stalled` (the "every
logged step" conditions hold vacuously) unless it diverged, every figure
None, its time to T censored at the budget. A diverged run whose last
finite record had reached T is `diverged` with `reached_step` set and its
time to T observed.

Time to T is a censored observation for Kaplan–Meier (attn.analysis.stats): the
reached step, observed, for a seed that reached T (whatever happened next);
else the budget, censored — a diverged seed that never reached T included,
since it would not have reached T within the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

THRESHOLD = 0.99  # eval accuracy at which a seed has learned the task
THRESHOLDS = (0.95, 0.98, 0.99)  # the thresholds a report shows the counts at, to see how they move
NEAR_ACCURACY = 0.95  # a slow seed whose best eval accuracy is at least this is `near`
UNSTABLE_FACTOR = 2.0  # ... else `unstable` if its final eval loss is more than this times its best
PLATEAU_FRACTION = 0.9  # a seed has left the plateau once its eval loss is below this fraction of the plateau level L
ACCURACY_BAR_FACTOR = 2.0  # ... or its eval accuracy is above this multiple of chance accuracy 1/C

LEARNED = "learned"
LEARNED_THEN_LOST = "learned then lost"
STALLED = "stalled"
SLOW = "slow"
DIVERGED = "diverged"
OUTCOMES = (LEARNED, LEARNED_THEN_LOST, STALLED, SLOW, DIVERGED)  # the order reports list them in


class CensoredTime(NamedTuple):
    """A time to an event: `time` the event's step if `observed`, else the
    step at which watching stopped (the event had not happened by then)."""

    time: int
    observed: bool


NEAR, UNSTABLE, FAR = "near", "unstable", "far"  # what a slow seed did (RunOutcome.slow_kind)
CHANCE_LEVEL, NO_RETRIEVAL_LEVEL = "chance", "no-retrieval"  # the plateau a seed that did not learn sat at


@dataclass(frozen=True)
class RunOutcome:
    """What became of one seed (module docstring); figures None where no
    finite value exists."""

    outcome: str  # one of OUTCOMES
    reached_step: int | None  # first logged step with eval accuracy >= threshold
    left_plateau_step: int | None  # first logged step with accuracy > bar or loss < fraction x plateau
    best_accuracy: float | None
    best_loss: float | None
    final_accuracy: float | None  # the last logged record's
    final_loss: float | None
    time_to_threshold: CensoredTime  # censored at the budget if never reached
    slow_kind: str | None = None  # a slow seed: NEAR, UNSTABLE or FAR (module docstring); else None
    sat_at: str | None = None  # a seed that never reached T: CHANCE_LEVEL (stalled), NO_RETRIEVAL_LEVEL or None

    @property
    def diverged_after_reaching(self) -> bool:
        return self.outcome == DIVERGED and self.reached_step is not None


def classify(
    steps,
    eval_accuracy,
    eval_loss,
    *,
    diverged: bool,
    budget: int,
    plateau_loss: float,
    chance_accuracy: float,
    threshold: float = THRESHOLD,
    plateau_fraction: float = PLATEAU_FRACTION,
    accuracy_bar_factor: float = ACCURACY_BAR_FACTOR,
    no_retrieval_loss: float | None = None,
    near_accuracy: float = NEAR_ACCURACY,
    unstable_factor: float = UNSTABLE_FACTOR,
) -> RunOutcome:
    """The outcome of one seed's run from its eval curve (module docstring).
    steps: increasing logged steps (n,); eval_accuracy, eval_loss: (n,), NaN
    where non-finite or missing. Raises ValueError on inconsistent input."""
    steps = np.asarray(steps, dtype=np.int64).reshape(-1)  # (n,)
    accuracy = _finite_or_nan(eval_accuracy)  # (n,)
    loss = _finite_or_nan(eval_loss)  # (n,)
    if not len(steps) == len(accuracy) == len(loss):
        raise ValueError(
            f"steps, eval_accuracy and eval_loss: got lengths {len(steps)}, {len(accuracy)}, "
            f"{len(loss)}; expected one value per logged step"
        )
    if np.any(np.diff(steps) <= 0):
        raise ValueError(f"steps: got {steps.tolist()}; expected strictly increasing steps")
    if not 0 < chance_accuracy <= 1:
        raise ValueError(f"chance_accuracy: got {chance_accuracy}; expected 1/C, in (0, 1]")
    with np.errstate(invalid="ignore"):  # NaN compares False: evidence of nothing
        reached = accuracy >= threshold  # (n,)
        left = (accuracy > accuracy_bar_factor * chance_accuracy) | (loss < plateau_fraction * plateau_loss)  # (n,)
    reached_step = _first_step(steps, reached)
    left_plateau_step = _first_step(steps, left)
    final_accuracy = _value(accuracy[-1]) if len(accuracy) else None
    if diverged:
        outcome = DIVERGED
    elif reached_step is not None:
        outcome = LEARNED if final_accuracy is not None and final_accuracy >= threshold else LEARNED_THEN_LOST
    else:
        outcome = SLOW if left_plateau_step is not None else STALLED
    best_accuracy = _value(np.nanmax(accuracy)) if np.isfinite(accuracy).any() else None
    best_loss = _value(np.nanmin(loss)) if np.isfinite(loss).any() else None
    final_loss = _value(loss[-1]) if len(loss) else None
    slow_kind = None
    if outcome == SLOW:
        slow_kind = (
            NEAR
            if best_accuracy is not None and best_accuracy >= near_accuracy
            else UNSTABLE
            if final_loss is not None and best_loss is not None and final_loss > unstable_factor * best_loss
            else FAR
        )
    sat_at = None
    if outcome == STALLED:
        sat_at = CHANCE_LEVEL
    elif (
        reached_step is None
        and left_plateau_step is not None
        and no_retrieval_loss is not None
        and math.isfinite(no_retrieval_loss)
        and (best_loss is None or best_loss >= plateau_fraction * no_retrieval_loss)
    ):
        sat_at = NO_RETRIEVAL_LEVEL  # left chance, never went below the loss of a model that retrieves nothing
    return RunOutcome(
        outcome,
        reached_step,
        left_plateau_step,
        best_accuracy=best_accuracy,
        best_loss=best_loss,
        final_accuracy=final_accuracy,
        final_loss=final_loss,
        time_to_threshold=CensoredTime(reached_step, True)
        if reached_step is not None
        else CensoredTime(int(budget), False),
        slow_kind=slow_kind,
        sat_at=sat_at,
    )


def definitions(
    threshold: float = THRESHOLD,
    plateau_fraction: float = PLATEAU_FRACTION,
    accuracy_bar_factor: float = ACCURACY_BAR_FACTOR,
    *,
    plateau_loss: float | None = None,
    chance_accuracy: float | None = None,
) -> str:
    """One paragraph of plain text defining every outcome class with the
    numbers in force, for reports to include. Give plateau_loss and
    chance_accuracy when every seed of the report shares them, to have
    their values printed too."""
    level = f"{plateau_fraction:g} L" + ("" if plateau_loss is None else f" = {plateau_fraction * plateau_loss:.3g}")
    bar = f"{accuracy_bar_factor:g}/C" + (
        "" if chance_accuracy is None else f" = {accuracy_bar_factor * chance_accuracy:.3g}"
    )
    plateau = "" if plateau_loss is None else f", here {plateau_loss:.3g} nats"
    chance = "" if chance_accuracy is None else f" (chance accuracy 1/C = {chance_accuracy:.3g})"
    t = f"{threshold:g}"
    return (
        f"Outcome of a seed, from its logged eval curve, with L the plateau level (in reports chance, ln C: the loss "
        f"of a model that predicts nothing{plateau}) and C the number of classes{chance}. A seed reaches {t} "
        f"at the first logged step with eval accuracy >= {t}, and leaves the plateau at the first logged step "
        f"with eval accuracy > {bar} "
        f"or eval loss < {level} (a non-finite value counts as neither). {DIVERGED!r}: the run ended on a non-finite "
        f"value, whether or not it had reached {t} before (said apart). Of the runs that completed: {LEARNED!r}: "
        f"reached {t} and still >= {t} at the last logged step; {LEARNED_THEN_LOST!r}: reached {t}, ended below it; "
        f"{SLOW!r}: never reached {t}, left the plateau, and of those {NEAR!r} if its best accuracy was >= "
        f"{NEAR_ACCURACY:g}, else {UNSTABLE!r} if its final loss was more than {UNSTABLE_FACTOR:g} times its best, "
        f"else {FAR!r}; {STALLED!r}: never reached {t}, never left the plateau. A seed that never reached {t} and "
        f"left chance but whose best loss stayed >= {plateau_fraction:g} times the task's no-retrieval loss (where "
        f"it has one) sat at the {NO_RETRIEVAL_LEVEL} level. "
        f"Time to {t} is a censored observation: a seed that never reached {t}, a diverged one included, counts as "
        f"not there yet at the budget."
    )


def _finite_or_nan(values) -> np.ndarray:
    values = np.array(values, dtype=np.float64).reshape(-1)  # (n,)
    values[~np.isfinite(values)] = np.nan
    return values


def _first_step(steps: np.ndarray, condition: np.ndarray) -> int | None:
    hits = np.flatnonzero(condition)
    return int(steps[hits[0]]) if len(hits) else None


def _value(x) -> float | None:
    return None if np.isnan(x) else float(x)
