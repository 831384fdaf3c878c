"""The materialized re-run of the cells a report judges its claims at, alone: for an experiment too
large to re-make whole with the d_k-wide head on the machine at hand.

    attn verify experiments/two_factors.yaml --published --judged-cells

attn verify's materialized re-run (attn.experiment.verify) re-makes every width-free cell up to
MATERIALIZED_WIDTH, every seed, and its report chooses each arm's rate again on the re-made
selection seeds. This one re-makes, with model.width_free=false, only the cells that some claims
were judged at as run, where every one of a claim's cells runs width-free and fits: its arms at each
x it covers, at the rate chosen there (report.json's `best`) or at the shared one, every seed of
them. Only claims judged over the whole run (no `budget`), at the chosen or the shared rate, and on a
statistic of one cell (not lr_sensitivity) can be so re-judged; the others were judged at cells
chosen on runs this does not make. The report of those cells alone (`attn report`) judges each claim
where its (x, arm) holds one cell, the one chosen as run; a claim is re-judged where that report
judged it at every x the report as run did, at the cells it was judged at as run. A tested claim's
one-sided p, and its opposite's, then enter Holm's correction with the p as run of every other tested
claim, as in the report as run (attn.analysis.verdicts.holm_verdicts). Every other claim, and every
cell not re-made, reads NOT_RERUN and is not compared. So it tests the verdicts under the second
algorithm given the rates chosen as run, not the choice of the rates; the comparison is merged with
the experiment's other re-runs by `attn publish NAME --verification-only` (attn.experiment.verification.merge).
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attn.analysis.verdicts import holm_verdicts
from attn.config.yamlio import yaml_line
from attn.experiment import verify
from attn.experiment.spec import Experiment, only_argument
from attn.experiment.verification import JUDGED_ONLY, NOT_RERUN, cell_key, write_record
from attn.store import runs
from attn.text import json_number, settings_json, value_of


@dataclass(frozen=True)
class JudgedPlan:
    """The cells to re-make and the `attn sweep` passes that do it (one a cell: --only each of its grid
    keys' values), their number of runs, the claims whose every judged cell they are, and what it does,
    in words."""

    passes: list[list[str]]
    cells: list[dict]  # their settings, as report.json has them
    runs: int
    claims: dict[str, set[str]]  # claim id -> the cells it is judged at (_norm of their settings)
    said: str


def _norm(values) -> str:
    """Settings, an x or an arm, from a file or from JSON, as one comparable text (json_number(value_of),
    a number as a float: 0 and 0.0 are one value, as the report takes them)."""

    def one(value):
        value = json_number(value_of(value))
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    if isinstance(values, dict):
        return cell_key({k: one(v) for k, v in values.items()})
    return cell_key([one(v) for v in values])


def rejudgeable(e) -> bool:
    """Whether a claim's verdict can be judged again on its judged cells alone: judged at the rate chosen
    or at the shared one, over the whole budget (a claim that declares a budget is judged at cells chosen
    within it; one at every rate on every rate; lr_sensitivity over every rate of an arm)."""
    return e.budget is None and e.at in ("best", "shared") and e.stat != "lr_sensitivity"


def claim_cells(experiment: Experiment, as_run: dict) -> dict[str, list[dict]]:
    """Each re-judgeable claim's judged cells in the report as run: its arms at each x it was judged at,
    at the rate chosen there (report.json's `best`) or at the shared one. RunError where the report names
    a cell the file does not have (its grid edited since)."""
    spec = experiment.report
    best = {(_norm(b["x"]), _norm(b["arm"])): b["settings"] for b in as_run.get("best", [])}
    cells = {_norm(settings_json(c.settings)): settings_json(c.settings) for c in experiment.cells}

    def place(settings: dict) -> tuple[str, str]:
        return _norm([settings.get(k) for k in spec.x]), _norm([settings.get(k) for k in spec.arm])

    shared = {
        place(s): s
        for s in cells.values()
        if spec.shared is not None and _norm([s.get(spec.best_of)]) == _norm([spec.shared])
    }
    judged = {j["id"]: j for j in as_run["expectations"]}
    out = {}
    for e in spec.expect:
        if not rejudgeable(e) or e.id not in judged:
            continue
        arms = [_norm([v for _, v in side]) for side in (e.arm, e.better_than) if side is not None]
        at = best if e.at == "best" else shared
        points = [p for p in judged[e.id]["points"] if "note" not in p]  # a point "no finished runs": judged nowhere
        if not points or len(points) < len(judged[e.id]["points"]):
            continue
        needed = [at.get((_norm(p["x"]), arm)) for p in points for arm in arms]
        missing = [s for s in needed if s is None or _norm(s) not in cells]
        if missing:
            raise runs.RunError(
                f"verify: the report as run judged {e.id} at {yaml_line(missing[0]) if missing[0] else 'a cell'} "
                f"that is no cell of {experiment.path} now (its {e.at} rate); verify it against the file "
                "it was made from"
            )
        out[e.id] = list({_norm(s): s for s in needed}.values())
    return out


def judged_plan(experiment: Experiment, as_run: dict) -> JudgedPlan:
    """The cells of the claims whose every judged cell (claim_cells) runs width-free up to
    MATERIALIZED_WIDTH, each a pass; RunError where there is no such claim."""
    fits = verify.materialized_plan(experiment).rerun
    fitting = {_norm(settings_json(c.settings)) for c in experiment.cells if c.name in fits}
    claims = {
        cid: {_norm(s) for s in needed}
        for cid, needed in claim_cells(experiment, as_run).items()
        if all(_norm(s) in fitting for s in needed)
    }
    if not claims:
        raise runs.RunError(
            f"verify: --judged-cells: no claim of {experiment.name} is judged at cells that all run width-free "
            f"up to d_k {verify.MATERIALIZED_WIDTH} (at its chosen or shared rate, over its whole budget); "
            "there is nothing to re-judge with the materialized head"
        )
    wanted = set().union(*claims.values())
    cells: dict[str, tuple] = {}
    runs_of: dict[str, int] = {}
    for cell in experiment.cells:
        key = _norm(settings_json(cell.settings))
        if key in wanted:
            cells.setdefault(key, cell.settings)
            runs_of[key] = runs_of.get(key, 0) + 1
    passes = [
        ["model.width_free=false", *(a for k, v in settings for a in ("--only", only_argument(k, (v,))))]
        for settings in cells.values()
    ]
    shared = any(e.at == "shared" for e in experiment.report.expect if e.id in claims)
    said = (
        f"only the {len(cells)} cells that {len(claims)} claims are judged at (at the rates chosen as run"
        f"{', or the shared one' if shared else ''}), width-free up to d_k {verify.MATERIALIZED_WIDTH}, every seed "
        f"({sum(runs_of.values())} runs), re-run with model.width_free=false"
    )
    return JudgedPlan(passes, [settings_json(s) for s in cells.values()], sum(runs_of.values()), claims, said)


def rejudged(experiment: Experiment, as_run: dict, remade: dict, plan: JudgedPlan) -> dict[str, str]:
    """Each claim's verdict on the re-made cells (`remade`: the report of those cells alone), where it
    can be judged there: a claim of the plan whose every judged cell the re-made report has, finished, and
    judged there (its choice at each (x, arm) the one as run), else NOT_RERUN; a tested claim's through
    Holm's correction with the p as run of the claims not re-judged. RunError where that correction over
    the p as run alone does not give the verdicts as run (the report was judged by another rule)."""
    made = {e["id"]: e for e in remade["expectations"]}
    finished = {_norm(c["settings"]) for c in remade["cells"] if c["n"] and not sum(c["unfinished"].values())}
    best = {(_norm(b["x"]), _norm(b["arm"])): _norm(b["settings"]) for b in remade.get("best", [])}
    spec = experiment.report

    at = {e.id: e.at for e in spec.expect}

    def judged_there(key: str, claim: str) -> bool:  # at its (x, arm) the re-made report chose it, as run
        if at[claim] == "shared":
            return True  # the cell at the shared rate: one a (x, arm), chosen by no rule
        settings = next(c["settings"] for c in remade["cells"] if _norm(c["settings"]) == key)
        return best.get((_norm([settings.get(k) for k in spec.x]), _norm([settings.get(k) for k in spec.arm]))) == key

    def xs(judged: dict) -> list[str]:
        return sorted(_norm(p["x"]) for p in judged["points"])

    def covered(judged: dict) -> bool:
        mine, needed = made.get(judged["id"]), plan.claims.get(judged["id"])
        return (
            mine is not None
            and needed is not None
            and needed <= finished
            and all(judged_there(key, judged["id"]) for key in needed)
            and xs(mine) == xs(judged)
            and all("note" not in p for p in mine["points"])
        )

    alpha = experiment.report.alpha
    tested = lambda judged: [copy.deepcopy(j) for j in judged if j.get("test", "interval") != "interval"]  # noqa: E731
    as_judged = tested(as_run["expectations"])
    holm_verdicts([_numbers(j) for j in as_judged], alpha)
    moved = [j["id"] for j, k in zip(as_judged, tested(as_run["expectations"])) if j["verdict"] != k["verdict"]]
    if moved:
        raise runs.RunError(
            f"verify: {experiment.name}: Holm's correction over the p as run does not give the verdicts as "
            f"run ({', '.join(moved)}); its report was judged by another rule: re-run it whole"
        )
    mixed = [made[j["id"]] if covered(j) else j for j in as_run["expectations"]]
    family = tested(mixed)
    holm_verdicts([_numbers(j) for j in family], alpha)
    verdicts = {j["id"]: j["verdict"] for j in family}
    return {
        j["id"]: (verdicts.get(j["id"]) or made[j["id"]]["verdict"]) if covered(j) else NOT_RERUN
        for j in as_run["expectations"]
    }


def _numbers(judged: dict) -> dict:
    """A judged claim read back from JSON with its p-values as floats (NaN where it has none)."""

    def number(value) -> float:
        return float(value) if runs.is_finite_number(value) else math.nan

    for holder in (judged, *judged["points"]):
        for key in ("p", "p_reverse"):
            if key in holder:
                holder[key] = number(holder[key])
    return judged


def verify_judged(
    experiment: Experiment,
    workers: int | None,
    progress: Callable[[str], None] = lambda message: None,
    as_run: Path | None = None,
    attn: tuple[list[str], Path | None, str] | None = None,
) -> dict:
    """Re-make the judged cells with the materialized head, write the report of them alone, and compare
    each claim's verdict there with the report's as run (module docstring); written, as attn verify's
    comparison is, to runs/verify/<name>.md and .json. `as_run`: the directory of the report to verify
    (default: the experiment's own); `attn`: the checkout whose code re-makes the runs (verify.rerun)."""
    reference = Path(as_run) if as_run is not None else experiment.directory
    report = verify.checked_report(experiment, reference, "as run")
    plan = judged_plan(experiment, report)
    directory = verify.rerun(experiment, "materialized", plan.passes, dict(os.environ), workers, progress, attn)
    remade = runs.read_report_json(directory)
    expected = {_norm(s) for s in plan.cells}
    cells = {_norm(c["settings"]): c for c in remade["cells"]}
    if set(cells) - expected:  # its report would choose among them: each claim judged elsewhere
        raise runs.RunError(
            f"verify: {directory}: holds runs of {len(set(cells) - expected)} cells that no claim is judged at "
            "(an earlier re-run's); move them out of the way, then run the same command again"
        )
    missing = sorted(expected - {k for k, c in cells.items() if c["n"] and not sum(c["unfinished"].values())})
    if missing or sum(cells[k]["n"] for k in expected) != plan.runs:
        raise runs.RunError(
            f"verify: {directory / runs.REPORT_FILE}: holds {sum(c['n'] for c in remade['cells'])} finished runs, "
            f"not the {plan.runs} of the {len(expected)} judged cells; run the same command again to finish them"
        )
    verdicts = rejudged(experiment, report, remade, plan)
    rejudged_report = {"expectations": [{"id": cid, "verdict": v} for cid, v in verdicts.items()]}
    rows = verify.compare_verdicts({"as run": report, "materialized": rejudged_report})
    reports = {"as run": report, "materialized": remade}
    not_made = {cell_key(c["settings"]) for c in report["cells"]} - {cell_key(s) for s in plan.cells}
    judged = sum(v != NOT_RERUN for v in verdicts.values())
    result = {
        "experiment": experiment.name,
        "as_run": verify.as_run_record(reference / runs.REPORT_FILE, as_run is not None),
        "platforms": {"as run": report["platform"], "materialized": remade["platform"]},
        "expectations": rows,
        "agree": all(r["agree"] for r in rows),
        "cells": verify.compare_cells(reports, not_rerun={"materialized": not_made}),
        "unchanged": verify.unchanged_runs(reports),
        "materialized": f"{plan.said}; {judged} of {len(rows)} claims judged there at the rates chosen as run, "
        "which it does not choose again (attn verify --judged-cells)",
        JUDGED_ONLY: True,
    }
    return write_record(result, Path(experiment.cells[0].config.runs_dir))
