"""The materialized re-run of the cells a report judges its claims at, alone: for an experiment too
large to re-make whole with the d_k-wide head on the machine at hand.

    attn verify experiments/two_factors.yaml --published --judged-cells

attn verify's materialized re-run (attn.experiment.verify) re-makes every width-free cell up to
MATERIALIZED_WIDTH, every seed, and its report chooses each arm's rate again on the re-made
selection seeds. This one re-makes, with model.width_free=false, only the cells the report as run
judged its claims at (each (x, arm)'s chosen setting, report.json's `best`, and its shared one where
a claim is judged there) that run width-free and fit, every seed of them, and writes the report of
those cells alone (`attn report`): each (x, arm) then has one cell, so each claim is judged at the
rate chosen as run. A claim is re-judged where that report judges it at every x the report as run
did, at the full budget and at the chosen or shared rate (a claim judged within a shorter budget or
at every rate is judged at cells chosen on runs this does not make). A tested claim's one-sided p,
and its opposite's, then enter Holm's correction with the p as run of every other tested claim, as
in the report as run (attn.analysis.verdicts.holm_verdicts). Every other claim, and every cell not re-made,
reads NOT_RERUN and is not compared. So it tests the verdicts under the second algorithm given the
rates chosen as run, not the choice of rates; the comparison is merged with the experiment's other
re-runs by `attn publish NAME --verification-only` (attn.experiment.verify.merge).
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attn.analysis.verdicts import holm_verdicts
from attn.experiment import verify
from attn.experiment.spec import Experiment, only_argument
from attn.store import runs
from attn.text import settings_json, value_of


@dataclass(frozen=True)
class JudgedPlan:
    """The cells to re-make and the `attn sweep` passes that do it (one a cell: --only each of its grid
    keys' values), their number of runs, and what it does, in words."""

    passes: list[list[str]]
    cells: list[dict]  # their settings, as report.json has them
    runs: int
    said: str


def judged_settings(experiment: Experiment, as_run: dict) -> list[dict]:
    """The settings of every cell the report as run judged a claim at that it can judge again (at its
    full budget, at the chosen or the shared rate): each such claim's arms at each x it covers, at the
    rate chosen there (report.json's `best`) or at the shared one."""
    spec = experiment.report

    def place(settings: dict) -> tuple[tuple, tuple]:
        return tuple(value_of(settings.get(k)) for k in spec.x), tuple(value_of(settings.get(k)) for k in spec.arm)

    def judged_at(settings: dict, at: str) -> bool:
        x, arm = place(settings)
        return any(
            e.budget is None
            and e.at == at
            and all(v in dict(e.where).get(k, (v,)) for k, v in zip(spec.x, x))
            and arm in [tuple(value_of(v) for _, v in side) for side in (e.arm, e.better_than) if side is not None]
            for e in spec.expect
        )

    chosen = [b["settings"] for b in as_run.get("best", []) if judged_at(b["settings"], "best")]
    if spec.shared is not None:
        chosen += [
            settings_json(c.settings)
            for c in experiment.cells
            if value_of(dict(c.settings).get(spec.best_of)) == spec.shared
            and judged_at(settings_json(c.settings), "shared")
        ]
    return list({verify._key(s): s for s in chosen}.values())


def judged_plan(experiment: Experiment, as_run: dict) -> JudgedPlan:
    """The judged cells (judged_settings) that run width-free up to MATERIALIZED_WIDTH, each a pass."""
    fits = verify.materialized_plan(experiment).rerun
    wanted = {verify._key(s) for s in judged_settings(experiment, as_run)}
    cells: dict[str, tuple] = {}
    runs_of: dict[str, int] = {}
    for cell in experiment.cells:
        key = verify._key(settings_json(cell.settings))
        if cell.name in fits and key in wanted:
            cells.setdefault(key, cell.settings)
            runs_of[key] = runs_of.get(key, 0) + 1
    passes = [
        ["model.width_free=false", *(a for k, v in settings for a in ("--only", only_argument(k, (v,))))]
        for settings in cells.values()
    ]
    said = (
        f"only the {len(cells)} cells the claims are judged at (each arm's rate as chosen as run) that run "
        f"width-free up to d_k {verify.MATERIALIZED_WIDTH}, every seed ({sum(runs_of.values())} runs), re-run "
        "with model.width_free=false"
    )
    return JudgedPlan(passes, [settings_json(s) for s in cells.values()], sum(runs_of.values()), said)


def rejudged(experiment: Experiment, as_run: dict, remade: dict) -> dict[str, str]:
    """Each claim's verdict on the re-made cells (`remade`: the report of those cells alone), where it
    can be judged there (module docstring), else NOT_RERUN; a tested claim's through Holm's correction
    with the p as run of the claims not re-judged. RunError where that correction over the p as run
    alone does not give the verdicts as run (the report was judged by another rule)."""
    declared = {e.id: e for e in experiment.report.expect}
    made = {e["id"]: e for e in remade["expectations"]}

    def xs(judged: dict) -> list[str]:
        return sorted(verify._key(p["x"]) for p in judged["points"])

    def covered(judged: dict) -> bool:
        e, mine = declared.get(judged["id"]), made.get(judged["id"])
        return (
            e is not None
            and mine is not None
            and e.budget is None
            and e.at != "every"
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
        j["id"]: (verdicts.get(j["id"]) or made[j["id"]]["verdict"]) if covered(j) else verify.NOT_RERUN
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
    if not plan.passes:
        raise runs.RunError(
            f"verify: --judged-cells: no cell that a claim of {experiment.name} is judged at runs width-free "
            f"up to d_k {verify.MATERIALIZED_WIDTH}; there is nothing to re-run with the materialized head"
        )
    directory = verify.rerun(experiment, "materialized", plan.passes, dict(os.environ), workers, progress, attn)
    remade = runs.read_report_json(directory)
    expected = {verify._key(s) for s in plan.cells}
    cells = {verify._key(c["settings"]): c for c in remade["cells"]}
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
    verdicts = rejudged(experiment, report, remade)
    rows = [
        {"id": e["id"], "verdicts": verdicts_of, "agree": verify.verdicts_agree(verdicts_of)}
        for e in report["expectations"]
        for verdicts_of in [{"as run": e["verdict"], "materialized": verdicts[e["id"]]}]
    ]
    reports = {"as run": report, "materialized": remade}
    not_made = {verify._key(c["settings"]) for c in report["cells"]} - expected
    judged = sum(v != verify.NOT_RERUN for v in verdicts.values())
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
        verify.JUDGED_ONLY: True,
    }
    out = Path(experiment.cells[0].config.runs_dir) / "verify"
    out.mkdir(parents=True, exist_ok=True)
    runs.write_json(out / f"{experiment.name}.json", result)
    runs.write_atomic(out / f"{experiment.name}.md", verify.verify_markdown(result).encode())
    result["files"] = [str(out / f"{experiment.name}.md"), str(out / f"{experiment.name}.json")]
    return result
