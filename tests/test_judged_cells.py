"""The materialized re-run of the judged cells alone (attn.report.judged_cells): which cells it
re-makes, which claims it re-judges, Holm's correction over the re-judged p and the p as run, and
how its comparison reads and merges. Runs are hand-made (test_report's helpers): the re-run's
`attn sweep` passes write the curves a test gives, and its report is the real one."""

import copy
import json

import pytest
from helpers import facts_in
from test_report import LEARNED, NONE, SQRT, STALLED, curve, load, write_run

from attn import cli, results_text
from attn.experiment import spec as experiments
from attn.experiment import verification, verify
from attn.report import experiment_figures, judged_cells
from attn.report.experiment_report import write_report
from attn.store import runs

WIDE = 2 * verify.MATERIALIZED_WIDTH  # runs width-free, too wide to re-run materialized
SELECT, JUDGE = [0, 1], [2, 3, 4, 5, 6, 7]
CLAIMS = [
    {"id": "more", "claim": "c", "stat": "success_rate", "arm": SQRT, "better_than": NONE, "test": "mcnemar"},
    {"id": "learns", "claim": "c", "stat": "success_rate", "arm": SQRT, "above": 0.5},
    {"id": "learns-early", "claim": "c", "stat": "success_rate", "arm": SQRT, "above": 0.5, "budget": 30},
    {
        "id": "more-wide",
        "claim": "c",
        "stat": "success_rate",
        "arm": SQRT,
        "better_than": NONE,
        "test": "mcnemar",
        "where": {"model.d_k": [WIDE]},
    },
]


def narrow(claim: dict) -> dict:
    """The claim at d_k 256 alone (its `where`), unless it names its own."""
    return claim if "where" in claim else {**claim, "where": {"model.d_k": [256]}}


def curves(settings: dict, seed: int, flipped: bool = False) -> list[tuple]:
    """The scaled head learns (sooner at lr 1); the unscaled one stalls at lr 0.1 and learns in the
    selection seeds alone at lr 1 (its best there); `flipped`: the unscaled head learns everywhere."""
    if settings["model.scale"] == "sqrt":
        return curve(LEARNED, step=20 if settings["optim.lr"] == 1.0 else 40)
    if settings["optim.lr"] == 1.0 and (flipped or seed in SELECT):
        return curve(LEARNED)
    return curve(STALLED)


@pytest.fixture
def experiment(tmp_path):
    """An experiment at d_k 256 and WIDE, two arms, two rates, selection and judging seeds (no runs)."""
    grid = {"model.d_k": [256, WIDE], "model.scale": ["sqrt", "none"], "optim.lr": [0.1, 1.0]}
    report = {
        "x": "model.d_k",
        "arm": "model.scale",
        "best_of": "optim.lr",
        "select": ["max success_rate", "min median_time"],
        "select_on": SELECT,
        "judge_on": JUDGE,
        "expect": [narrow(c) for c in CLAIMS],
    }
    return load(tmp_path, grid, SELECT + JUDGE, report)


@pytest.fixture
def made(experiment, monkeypatch):
    """The experiment's runs and report as run (no figures: other tests draw them); `attn sweep`'s
    passes into runs/verify/materialized faked: each pass writes its cells' runs
    (curves(flipped=the state's flag)), and the last step writes their report."""
    monkeypatch.setattr(experiment_figures, "draw_all", lambda *args, **kwargs: {})
    for cell in experiment.cells:
        settings = dict(cell.settings)
        write_run(experiment, settings, cell.seed, curves(settings, cell.seed))
    write_report(experiment)
    state = {"flipped": False, "passes": []}

    def rerun(experiment, variant, passes, env, workers, progress, attn=None):
        state["passes"] = passes
        there = experiments.load_experiment(experiment.path, str(verify.variant_directory(experiment, variant)))
        for one in passes:
            only = [one[i + 1] for i, word in enumerate(one) if word == "--only"]
            part = experiments.load_experiment(experiment.path, str(there.directory.parent), only=only)
            for cell in part.cells:
                settings = dict(cell.settings)
                write_run(there, settings, cell.seed, curves(settings, cell.seed, state["flipped"]))
        write_report(there)
        return there.directory

    return experiment, state, rerun


def test_it_re_makes_each_arms_chosen_cell_that_fits_and_re_judges_the_claims_judged_there(made, monkeypatch):
    experiment, state, rerun = made
    monkeypatch.setattr(verify, "rerun", rerun)
    as_run = runs.read_report_json(experiment.directory)
    result = judged_cells.verify_judged(experiment, 1)
    only = sorted(" ".join(p) for p in state["passes"])
    assert len(only) == 2 and all("model.width_free=false" in p and "model.d_k=256" in p for p in only)
    assert {("model.scale=sqrt" in p, "optim.lr=1.0" in p) for p in only} == {(True, True), (False, True)}
    verdicts = {r["id"]: r["verdicts"] for r in result["expectations"]}
    as_judged = {e["id"]: e["verdict"] for e in as_run["expectations"]}
    assert as_judged["more"] == "confirmed" and as_judged["more-wide"] == "confirmed"
    assert {i: v["materialized"] for i, v in verdicts.items()} == {
        "more": "confirmed",
        "learns": "confirmed",
        "learns-early": verification.NOT_RERUN,  # judged within 30 steps: at cells chosen there
        "more-wide": verification.NOT_RERUN,  # wider than MATERIALIZED_WIDTH
    }
    assert all(v["as run"] == as_judged[i] for i, v in verdicts.items()) and result["agree"]
    learned = {json.dumps(c["settings"], sort_keys=True): c["learned"]["materialized"] for c in result["cells"]}
    assert sorted(learned.values()).count(verification.NOT_RERUN) == 6 and all(c["same"] for c in result["cells"])
    assert result["unchanged"]["materialized"]["runs"] == 16, "two cells of eight seeds, in both"
    assert facts_in(result["materialized"], "2 cells", "16 runs", "2 of 4 claims", "--judged-cells")
    md = (experiment.directory.parent / "verify" / "exp.md").read_text()
    assert facts_in(
        md, "judged 2 of the 4 claims", "other 2", verification.NOT_RERUN, "declared budget", "2 confirmed as run"
    )


def test_a_claim_that_flips_on_the_re_made_cells_disagrees(made, monkeypatch):
    experiment, state, rerun = made
    state["flipped"] = True  # the unscaled head learns in every seed at lr 1, re-made
    monkeypatch.setattr(verify, "rerun", rerun)
    result = judged_cells.verify_judged(experiment, 1)
    verdicts = {r["id"]: r["verdicts"]["materialized"] for r in result["expectations"]}
    assert verdicts["more"] == "inconclusive" and verdicts["learns"] == "confirmed"
    assert not result["agree"] and [r["id"] for r in result["expectations"] if not r["agree"]] == ["more"]
    assert [c["learned"] for c in result["cells"] if not c["same"]] == [{"as run": "2/8", "materialized": "8/8"}]


def test_runs_of_other_cells_where_it_re_runs_are_refused_before_any_claim_is_judged(made, monkeypatch):
    experiment, state, rerun = made
    monkeypatch.setattr(verify, "rerun", rerun)
    there = experiments.load_experiment(experiment.path, str(verify.variant_directory(experiment, "materialized")))
    write_run(there, {"model.d_k": 256, "model.scale": "none", "optim.lr": 0.1}, 0, curve(LEARNED))
    with pytest.raises(runs.RunError) as info:
        judged_cells.verify_judged(experiment, 1)
    assert facts_in(str(info.value), str(there.directory), "1 cells that no claim is judged at")


SCALED_256 = {"model.d_k": 256, "model.scale": "sqrt", "optim.lr": 1.0}
ONE_CELL = judged_cells.JudgedPlan([], [SCALED_256], 8, {"more": {judged_cells._norm(SCALED_256)}}, "")


def re_made(expectations: list[dict]) -> dict:
    """A report of the one cell ONE_CELL re-makes, chosen there, judging these claims."""
    cell = {"settings": SCALED_256, "n": 8, "unfinished": {}}
    return {
        "expectations": expectations,
        "cells": [cell],
        "best": [{"x": [256], "arm": ["sqrt"], "settings": SCALED_256}],
    }


def family(p_more: float, p_wide: float, verdicts: tuple[str, str]) -> dict:
    """A report's two tested claims, judged with these one-sided p (their opposites' 1) and verdicts."""

    def claim(cid, p, verdict, x):
        point = {"x": [x], "p": p, "p_reverse": 1.0, "n": 6, "other_n": 6}
        return {"id": cid, "test": "mcnemar", "verdict": verdict, "p": p, "p_reverse": 1.0, "points": [point]}

    return {"expectations": [claim("more", p_more, verdicts[0], 256), claim("more-wide", p_wide, verdicts[1], WIDE)]}


def test_a_re_judged_p_is_corrected_with_the_p_as_run_of_the_claims_not_re_judged(experiment):
    """0.03 alone would be confirmed at 0.05; beside the wide claim's 0.2 as run, Holm doubles it."""
    as_run = family(0.01, 0.2, ("confirmed", "inconclusive"))  # Holm: 0.02, 0.2
    remade = family(0.03, 0.5, ("confirmed", "inconclusive"))  # the wide claim here is not re-judged
    remade["expectations"].pop()
    remade = re_made(remade["expectations"] + [{"id": "more-wide", "verdict": "inconclusive", "points": []}])
    verdicts = judged_cells.rejudged(experiment, as_run, remade, ONE_CELL)
    assert verdicts == {"more": "inconclusive", "more-wide": verification.NOT_RERUN}
    as_run = family(0.01, 0.01, ("confirmed", "confirmed"))
    assert judged_cells.rejudged(experiment, as_run, remade, ONE_CELL)["more"] == "confirmed", "0.03 x 1, second of two"
    chose_another = {**remade, "best": [{"x": [256], "arm": ["sqrt"], "settings": {**SCALED_256, "optim.lr": 0.1}}]}
    assert judged_cells.rejudged(experiment, as_run, chose_another, ONE_CELL)["more"] == verification.NOT_RERUN


def test_a_report_whose_verdicts_holm_does_not_give_is_refused(experiment):
    as_run = family(0.2, 0.2, ("confirmed", "inconclusive"))  # judged by some other rule
    with pytest.raises(runs.RunError) as info:
        judged_cells.rejudged(experiment, as_run, re_made(copy.deepcopy(as_run["expectations"])), ONE_CELL)
    assert facts_in(str(info.value), "more", "re-run it whole")


def test_merged_with_the_other_re_runs_a_claim_not_re_run_is_left_out_of_the_agreement():
    earlier = {
        "experiment": "w",
        "as_run": {"sha256": "a"},
        "platforms": {"as run": {}, "float64": {}},
        "expectations": [{"id": "x", "verdicts": {"as run": "confirmed", "float64": "confirmed"}, "agree": True}],
        "cells": [],
        "unchanged": {},
        "materialized": verification.NOT_ASKED,
    }
    later = {
        **earlier,
        "platforms": {"as run": {}, "materialized": {}},
        "expectations": [{"id": "x", "verdicts": {"as run": "confirmed", "materialized": verification.NOT_RERUN}}],
        "materialized": "only the 2 cells the claims are judged at",
    }
    merged = verification.merge(earlier, {**later, verification.JUDGED_ONLY: True})
    assert merged["agree"] and merged["expectations"][0]["verdicts"]["materialized"] == verification.NOT_RERUN
    assert facts_in(verification.verify_markdown(merged), "judged 0 of the 1 claims", "only the 2 cells")
    assert facts_in(
        verification.reruns_said(merged), "in float64", "materialized head on the cells of 0 of the 1 claims alone"
    )
    assert "judged at" not in verification.reruns_said(verification.merge(earlier, later))
    flipped = {"id": "y", "verdicts": {"as run": "confirmed", "float64": "inconclusive", "materialized": "not re-run"}}
    said = results_text.flips_said({"expectations": [{**flipped, "agree": False}]})
    assert said == "`y`: confirmed as run, inconclusive in float64"


@pytest.mark.parametrize("given", [["--variants", "float64"], ["--variants", "materialized", "--kernel", "Nehalem"]])
def test_the_cli_refuses_judged_cells_with_another_re_run_in_one_line(given, tmp_path, capsys):
    code = cli.main(["verify", str(tmp_path / "none.yaml"), "--judged-cells", *given])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert facts_in(err, "--judged-cells", given[-1], "--variants")


def test_for_a_published_report_that_commits_sweep_and_report_make_the_runs_in_its_worktree(tmp_path, monkeypatch):
    from test_published import setup

    from attn.report import published

    monkeypatch.chdir(tmp_path)
    experiment, results, children, _ = setup(tmp_path, monkeypatch, at_commit=False, runs_dir="runs")
    asked = []

    def rerun(experiment, variant, passes, env, workers, progress, attn=None):
        asked.append((experiment.directory, variant, attn))
        raise runs.RunError("stopped here")

    monkeypatch.setattr(verify, "rerun", rerun)
    monkeypatch.setattr(
        judged_cells, "judged_plan", lambda experiment, report: judged_cells.JudgedPlan([[]], [], 0, {}, "")
    )
    with pytest.raises(runs.RunError, match="stopped here"):
        published.verify_published(experiment, results, tmp_path / "repo", None, 2, print, judged_cells=True)
    tree = (tmp_path / "runs" / "published" / "176b2c4").resolve()
    assert [c[0][0] for c in children] == ["git", "make"], "its worktree and .venv; not its attn verify"
    assert asked == [
        (tree / "runs" / "w", "materialized", ([str(tree / ".venv/bin/python")], tree, "experiments/w.yaml"))
    ]


def test_the_cells_at_the_shared_rate_are_re_made_only_where_a_claim_is_judged_there(tmp_path):
    grid = {"model.d_k": [256, 512], "model.scale": ["sqrt", "none"], "optim.lr": [0.1, 1.0]}
    at_shared = {**CLAIMS[0], "id": "more-shared", "at": "shared", "where": {"model.d_k": [512]}}
    report = {
        "x": "model.d_k",
        "arm": "model.scale",
        "best_of": "optim.lr",
        "select": ["max success_rate"],
        "shared": 0.1,
        "select_on": SELECT,
        "judge_on": JUDGE,
        "expect": [at_shared, narrow(CLAIMS[1])],
    }
    experiment = load(tmp_path, grid, SELECT + JUDGE, report)
    best = [
        {"x": [d], "arm": [s], "settings": {"model.d_k": d, "model.scale": s, "optim.lr": 1.0}}
        for d in (256, 512)
        for s in ("sqrt", "none")
    ]
    judged = [{"id": "more-shared", "points": [{"x": [512]}]}, {"id": "learns", "points": [{"x": [256]}]}]
    chosen = judged_cells.claim_cells(experiment, {"best": best, "expectations": judged})
    assert {
        c: sorted((s["model.d_k"], s["model.scale"], s["optim.lr"]) for s in cells) for c, cells in chosen.items()
    } == {
        "more-shared": [(512, "none", 0.1), (512, "sqrt", 0.1)],  # both arms at the shared rate at 512
        "learns": [(256, "sqrt", 1.0)],  # the scaled arm's chosen rate at 256
    }
    best[0]["settings"]["optim.lr"] = 0.5  # the grid edited since: no such cell now
    with pytest.raises(runs.RunError) as info:
        judged_cells.claim_cells(experiment, {"best": best, "expectations": judged})
    assert facts_in(str(info.value), "learns", "0.5", "no cell of")


def test_a_file_whose_claims_all_need_a_cell_too_wide_has_nothing_to_re_judge(made):
    experiment, _, _ = made
    as_run = runs.read_report_json(experiment.directory)
    wide_only = {**as_run, "expectations": [e for e in as_run["expectations"] if e["id"] == "more-wide"]}
    with pytest.raises(runs.RunError) as info:
        judged_cells.judged_plan(experiment, wide_only)
    assert facts_in(str(info.value), "--judged-cells", "no claim", str(verify.MATERIALIZED_WIDTH))


def test_the_published_factorial_plans_its_eight_claims_cells_at_1024_and_4096_and_re_judges_them_as_run():
    """On two_factors' published report: the cells its 8 factorial claims at d_k 1024 and 4096 are judged
    at, and, with the report as run standing in for the re-made one, each re-judged to its verdict as run."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    experiment = experiments.load_experiment(root / "experiments" / "two_factors.yaml")
    as_run = json.loads((root / "experiments" / "results" / "two_factors" / "report.json").read_text())  # no seeds
    plan = judged_cells.judged_plan(experiment, as_run)
    assert (len(plan.cells), plan.runs) == (8, 240) and {c["model.d_k"] for c in plan.cells} == {1024, 4096}
    factors = ("small-step-helps-at-variance-dk", "small-step-helps-at-variance-1")
    factors += ("unit-variance-helps-at-small-step", "unit-variance-helps-at-big-step")
    assert sorted(plan.claims) == sorted(f"{a}-at-{d}" for a in factors for d in (1024, 4096))
    verdicts = judged_cells.rejudged(experiment, as_run, as_run, plan)
    as_judged = {e["id"]: e["verdict"] for e in as_run["expectations"]}
    assert {c: verdicts[c] for c in plan.claims} == {c: as_judged[c] for c in plan.claims}
    assert sum(v == verification.NOT_RERUN for v in verdicts.values()) == len(as_judged) - 8


def test_a_partial_re_run_is_said_as_partial_in_readme_and_never_merged_over_a_whole_one():
    rows = [
        {"id": i, "verdicts": {"as run": "confirmed", "materialized": m}, "agree": True}
        for i, m in (("a", "confirmed"), ("b", verification.NOT_RERUN))
    ]
    result = {
        "experiment": "w",
        "platforms": {"as run": {}, "materialized": {}},
        "expectations": rows,
        "agree": True,
        "materialized": "only the 2 cells",
        verification.JUDGED_ONLY: True,
    }
    assert facts_in(results_text._verification_said(result), "every verdict agrees so far", "judged 1 of the 2")
    assert "not yet re-run in float64" in results_text._verification_said(result)
    made = {**result, "platforms": {"as run": {}, "float64": {}, "Sandybridge": {}, "materialized": {}}}
    said = results_text._verification_said(made)
    assert said.startswith("every verdict agrees on re-run (the materialized re-run judged 1 of the 2 claims)")
    line = results_text.verification_line("w", result)
    assert facts_in(
        line, "every verdict agrees", "judged 1 of the 2", "attn verify experiments/w.yaml --published --judged-cells"
    )
    whole = {**result, "as_run": {"sha256": "a"}, "expectations": [{**rows[0]}]}
    whole.pop(verification.JUDGED_ONLY)
    with pytest.raises(runs.RunError, match="keep that one"):
        verification.merge(whole, {**result, "as_run": {"sha256": "a"}})


def test_a_re_run_made_on_another_cpu_than_the_runs_as_run_says_so_beside_its_flips():
    intel, epyc = {"cpu": ["Intel"], "blas": ["SkylakeX"]}, {"cpu": ["AMD EPYC"], "blas": ["Haswell"]}
    platforms = {"as run": intel, "float64": intel, "Sandybridge": {**intel, "blas": ["Sandybridge"]}}
    result = {"experiment": "w", "platforms": {**platforms, "materialized": epyc}, "expectations": [], "agree": True}
    said = " ".join(verification.platform_said(result))
    assert facts_in(said, "materialized re-run also ran on another CPU", "the machine") and "float64" not in said
    assert verification.platform_said({**result, "platforms": platforms}) == [], (
        "the second kernel's differs on purpose"
    )


def test_settings_match_across_int_and_float_and_a_judged_point_without_its_cell_is_refused(experiment):
    assert judged_cells._norm({"optim.lr": 1, "model.d_k": 256}) == judged_cells._norm(
        {"model.d_k": 256.0, "optim.lr": 1.0}
    )
    best = [{"x": [256], "arm": ["sqrt"], "settings": {"model.d_k": 256, "model.scale": "sqrt", "optim.lr": 1}}]
    judged = [{"id": "learns", "points": [{"x": [256]}]}, {"id": "more", "points": [{"x": [256]}]}]
    with pytest.raises(runs.RunError) as info:  # `more` needs the unscaled arm's chosen cell, which `best` lacks
        judged_cells.claim_cells(experiment, {"best": best, "expectations": judged})
    assert facts_in(str(info.value), "more", "no cell of", "best rate")
    assert judged_cells.claim_cells(experiment, {"best": best, "expectations": judged[:1]})["learns"] == [
        best[0]["settings"]
    ]
