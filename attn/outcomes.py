"""The outcome class of one run, from its logged eval curve: one definition
for the run's own summary, `attn runs`, compare, the board and every report.

It sits beside attn.tasks, whose tasks know the two plateau levels a run is
judged against, so that a run can name its outcome as it ends.

Inputs are arrays and numbers only: the logged steps, eval accuracy and
eval loss at those steps (NaN where a value is non-finite or missing),
whether the run diverged, its budget (train.steps), and the task's plateau
levels: chance L_c = ln C (a model that predicts nothing) and, for
retrieval, the no-retrieval loss L_nr (a model that knows the values in the
context but not which key was asked for; attn.tasks). The plateau a run has
to get below is the lower one, L = L_nr where the task has it, else L_c.

Per logged step, with T the accuracy threshold and f = PLATEAU_FRACTION:

    reached           eval accuracy >= T
    left the plateau  eval loss < f L

Leaving is judged on the loss alone: accuracy at chance is noisy (a model
at chance touches 2/C on a few eval batches), the loss is not. A NaN is
evidence of nothing: a NaN accuracy never reaches, a NaN loss never leaves,
and with no finite plateau level no step leaves.

The classes, checked in this order:

    diverged            the run ended on a non-finite value (the caller's
                        `diverged`); `reached_step` says whether it had
                        reached T before (`diverged_after_reaching`)
    learned             reached T, and the final eval accuracy is >= T
    learned then lost   reached T, and the final eval accuracy is < T or NaN
    slow                never reached T, left the plateau at some step; its
                        slow_kind says what it did: `near` (best accuracy
                        >= NEAR_ACCURACY), else `unstable` (final loss more
                        than UNSTABLE_FACTOR times its best), else `far`
    stalled             never reached T, never left the plateau: its best
                        eval loss stayed >= f L

A seed that never reached T says which plateau its best loss stayed at
(sat_at): `chance` if >= f L_c, `no-retrieval` if below that but >= f L_nr,
else None. `final` is the last logged record's value (None where NaN),
`best` the max accuracy / min loss over the finite values. A run with no
records, or only NaN values, is `stalled` unless it diverged.

Time to T is a censored observation for Kaplan–Meier (attn.analysis.stats):
the reached step, observed, for a seed that reached T (whatever happened
next); else the budget, censored — a diverged seed that never reached T
included, since it would not have reached T within the budget.
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
PLATEAU_FRACTION = 0.9  # a seed has left a plateau once its eval loss is below this fraction of the level

# Until issue 45 a seed also left the plateau once its eval accuracy passed 2/C, which a seed at chance can touch
# by noise; a report made then says so in its definitions. Of the claim statistics, only these rest on that rule
# (success and time to THRESHOLD do not).
EARLIER_PLATEAU_RULE = "eval accuracy > 2/C or eval loss < 0.9 L"
PLATEAU_STATS = ("stall_rate",)

LEARNED = "learned"
LEARNED_THEN_LOST = "learned then lost"
STALLED = "stalled"
SLOW = "slow"
DIVERGED = "diverged"
OUTCOMES = (LEARNED, LEARNED_THEN_LOST, STALLED, SLOW, DIVERGED)  # the order reports list them in
ENDED = ("completed", "diverged")  # the run statuses that have an outcome: a run still training has none yet


class CensoredTime(NamedTuple):
    """A time to an event: `time` the event's step if `observed`, else the
    step at which watching stopped (the event had not happened by then)."""

    time: int
    observed: bool


NEAR, UNSTABLE, FAR = "near", "unstable", "far"  # what a slow seed did (RunOutcome.slow_kind)
CHANCE_LEVEL, NO_RETRIEVAL_LEVEL = "chance", "no-retrieval"  # the plateau a seed that did not learn sat at


@dataclass(frozen=True)
class RunOutcome:
    """What became of one run (module docstring); figures None where no finite value exists."""

    outcome: str  # one of OUTCOMES
    reached_step: int | None  # first logged step with eval accuracy >= threshold
    left_plateau_step: int | None  # first logged step with eval loss < fraction x the lower plateau
    best_accuracy: float | None
    best_loss: float | None
    final_accuracy: float | None  # the last logged record's
    final_loss: float | None
    time_to_threshold: CensoredTime  # censored at the budget if never reached
    slow_kind: str | None = None  # a slow seed: NEAR, UNSTABLE or FAR; else None
    sat_at: str | None = None  # a seed that never reached T: CHANCE_LEVEL, NO_RETRIEVAL_LEVEL or None

    @property
    def diverged_after_reaching(self) -> bool:
        return self.outcome == DIVERGED and self.reached_step is not None

    def said(self) -> str:
        """The class in words, with the plateau a run that never learned sat at."""
        where = {CHANCE_LEVEL: "loss at chance", NO_RETRIEVAL_LEVEL: "loss at the no-retrieval plateau"}.get(
            self.sat_at
        )
        detail = self.slow_kind if self.outcome == SLOW else where if self.outcome == STALLED else None
        return f"{self.outcome} ({detail})" if detail else self.outcome


def classify(
    steps,
    eval_accuracy,
    eval_loss,
    *,
    diverged: bool,
    budget: int,
    chance_loss: float,
    no_retrieval_loss: float | None = None,
    threshold: float = THRESHOLD,
    plateau_fraction: float = PLATEAU_FRACTION,
    near_accuracy: float = NEAR_ACCURACY,
    unstable_factor: float = UNSTABLE_FACTOR,
) -> RunOutcome:
    """The outcome of one run from its eval curve (module docstring).
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
    chance_bar = plateau_fraction * _finite_or(chance_loss, math.nan)
    retrieval_bar = plateau_fraction * _finite_or(no_retrieval_loss, math.nan)
    lowest_bar = retrieval_bar if math.isfinite(retrieval_bar) else chance_bar
    with np.errstate(invalid="ignore"):  # NaN compares False: evidence of nothing
        reached = accuracy >= threshold  # (n,)
        left = loss < lowest_bar  # (n,)
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
        if best_accuracy is not None and best_accuracy >= near_accuracy:
            slow_kind = NEAR
        elif final_loss is not None and best_loss is not None and final_loss > unstable_factor * best_loss:
            slow_kind = UNSTABLE
        else:
            slow_kind = FAR
    sat_at = None
    if reached_step is None and outcome != DIVERGED:
        best = math.inf if best_loss is None else best_loss
        if not best < chance_bar:  # a NaN bar: nothing is known below chance
            sat_at = CHANCE_LEVEL
        elif best >= retrieval_bar:
            sat_at = NO_RETRIEVAL_LEVEL
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


def of_run(records: list[dict], summary: dict, threshold: float = THRESHOLD) -> RunOutcome | None:
    """The outcome of a run from its metrics records and summary.json (status,
    steps, references); None while it has not ended (ENDED)."""
    return of_curve(
        [r["step"] for r in records],
        [_finite_or(r.get("eval_accuracy"), math.nan) for r in records],
        [_finite_or(r.get("eval_loss"), math.nan) for r in records],
        summary,
        threshold,
    )


def of_curve(steps, eval_accuracy, eval_loss, summary: dict, threshold: float = THRESHOLD) -> RunOutcome | None:
    """of_run from the eval curve alone, as arrays (a caller that streams a long file keeps three numbers a record)."""
    if summary.get("status") not in ENDED:
        return None
    references = summary.get("references") or {}
    return classify(
        steps,
        eval_accuracy,
        eval_loss,
        diverged=summary["status"] == "diverged",
        budget=int(summary.get("steps") or 0),
        chance_loss=_finite_or(references.get("chance"), math.nan),
        no_retrieval_loss=_finite_or(references.get("no_retrieval"), math.nan),
        threshold=threshold,
    )


def summary_fields(records: list[dict], summary: dict) -> dict:
    """What summary.json says of a run's outcome once it has ended (of_run): `outcome` (its class),
    `outcome_said` (RunOutcome.said) and `outcome_detail` (what the class rests on); {} before it ended."""
    outcome = of_run(records, summary)
    if outcome is None:
        return {}
    return {
        "outcome": outcome.outcome,
        "outcome_said": outcome.said(),
        "outcome_detail": {
            "reached_step": outcome.reached_step,
            "left_plateau_step": outcome.left_plateau_step,
            "sat_at": outcome.sat_at,
            "slow_kind": outcome.slow_kind,
        },
    }


def definitions(
    threshold: float = THRESHOLD,
    plateau_fraction: float = PLATEAU_FRACTION,
    *,
    chance_loss: float | None = None,
    no_retrieval_loss: float | None = None,
) -> str:
    """One paragraph of plain text defining every outcome class with the
    numbers in force, for reports to include. Give the plateau levels when
    every seed of the report shares them, to have their values printed too."""
    f, t = f"{plateau_fraction:g}", f"{threshold:g}"
    levels = (
        ""
        if chance_loss is None
        else f" (here L_c = {chance_loss:.3g}"
        + (")" if no_retrieval_loss is None else f", L_nr = {no_retrieval_loss:.3g})")
    )
    return (
        f"Outcome of a seed, from its logged eval curve, with L_c = ln C the chance loss (a model that predicts "
        f"nothing) and L_nr the no-retrieval loss of a retrieval task (a model that knows the values in the context "
        f"but not which key was asked for){levels}; L is the lower of the two the task has. A seed reaches {t} at the "
        f"first logged step with eval accuracy >= {t}, and leaves the plateau at the first logged step with eval "
        f"loss < {f} L (a non-finite value counts as neither). {DIVERGED!r}: the run ended on a non-finite value, "
        f"whether or not it had reached {t} before (said apart). Of the runs that completed: {LEARNED!r}: reached "
        f"{t} and still >= {t} at the last logged step; {LEARNED_THEN_LOST!r}: reached {t}, ended below it; "
        f"{SLOW!r}: never reached {t}, left the plateau, and of those {NEAR!r} if its best accuracy was >= "
        f"{NEAR_ACCURACY:g}, else {UNSTABLE!r} if its final loss was more than {UNSTABLE_FACTOR:g} times its best, "
        f"else {FAR!r}; {STALLED!r}: never reached {t}, its best loss never below {f} L. A seed that never reached "
        f"{t} sat at the {CHANCE_LEVEL} level if its best loss stayed >= {f} L_c, else at the {NO_RETRIEVAL_LEVEL} "
        f"level if it stayed >= {f} L_nr. Time to {t} is a censored observation: a seed that never reached {t}, a "
        f"diverged one included, counts as not there yet at the budget."
    )


def _finite_or(value, default: float) -> float:
    """value as a float if it is a finite number (not a bool), else default."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def _finite_or_nan(values) -> np.ndarray:
    values = np.array(values, dtype=np.float64).reshape(-1)  # (n,)
    values[~np.isfinite(values)] = np.nan
    return values


def _first_step(steps: np.ndarray, condition: np.ndarray) -> int | None:
    hits = np.flatnonzero(condition)
    return int(steps[hits[0]]) if len(hits) else None


def _value(x) -> float | None:
    return None if np.isnan(x) else float(x)
