"""The experiment report, from hand-made run directories (config.yaml,
metrics.jsonl and summary.json written directly, no training): diverged
seeds have no final figures, seeds are classified by fate, the unfinished
are not counted, steps are compared with never = budget, runs made with
another config are left out and listed, best_of picks by steps to 99%,
the expectation block shows only for the headline layout, and a grid over
a mapping field reports."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from attn import runs, sweep
from attn import experiment as experiments
from attn.compare import short_names
from attn.config import replace, to_dict
from attn.report import (collect, conclusion, edge_notes, expectation_check, layout, select_best, table_rows,
                         write_report)
from attn.train import build_task

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 100
NAN = float("nan")
INIT = {"score_std": 4.0, "attn_entropy": 0.7, "saturated_frac": 0.1, "grad_norm/W_q": 1.5, "grad_norm/W_k": 1.25}


def load(tmp_path, grid, seeds, report, name="exp"):
    data = {"name": name, "base": str(ROOT / "configs" / "default.yaml"),
            "overrides": {"train.steps": BUDGET, "logging.log_every": 10, "optim.lr": 0.1}, "grid": grid,
            "seeds": list(seeds), "report": report}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return experiments.load_experiment(path, str(tmp_path / "runs"))


def write_run(experiment, settings: dict, seed: int, curve, status="completed", config=None):
    """A run directory as training would leave it: (step, eval loss, eval
    accuracy) records, NaN loss beside the garbage accuracy old code logged."""
    cell = next(c for c in experiment.cells if dict(c.settings) == settings and c.seed == seed)
    run_dir = experiment.directory / cell.name
    run_dir.mkdir(parents=True)
    runs.write_config(run_dir, to_dict(config or cell.config), {})
    for step, loss, accuracy in curve:
        runs.append_metrics(run_dir, {"step": step, "eval_loss": loss, "eval_accuracy": accuracy,
                                      **(INIT if step == 0 else {})})
    runs.write_json(run_dir / "summary.json", {
        "status": status, "step": curve[-1][0], "steps": BUDGET, "task": "retrieval",
        "references": build_task(cell.config).reference_losses()})
    return cell


START = (0, 2.8, 0.06)


def kept(step):  # reaches 99% at `step` and keeps it
    return [START, (step, 0.02, 0.995), (BUDGET, 0.01, 1.0)]


# Seeds of the unscaled cell at d_k = 64, one of each fate.
NONE_64 = {
    0: ("completed", kept(20)),
    1: ("diverged", [START, (30, 0.03, 0.992), (50, NAN, 0.07)]),  # reached 99%, then diverged
    2: ("completed", [START, (40, 0.3, 0.95), (BUDGET, 2.0, 0.4)]),  # learned, then lost it
    3: ("completed", [START, (50, 2.5, 0.2), (BUDGET, 2.45, 0.22)]),  # never left the plateau
    4: ("diverged", [START, (40, 2.6, 0.1), (60, NAN, 0.3)]),  # diverged on the plateau; 0.3 is garbage
    5: ("interrupted", [START, (30, 2.0, 0.5)]),
    6: ("completed", [START, (50, 0.9, 0.7), (BUDGET, 0.5, 0.9)]),  # left the plateau, ended short of 99%
    7: ("completed", [START, (40, 0.05, 0.993), (BUDGET, 0.7, 0.8)]),  # reached 99%, ended below it
}
SEEDS = range(8)


@pytest.fixture(scope="module")
def headline(tmp_path_factory):
    """d_k x scale, every fate in (64, none); at d_k = 16 one run made with
    another lr (left out) and one with another runs_dir (kept: no logged number changes)."""
    tmp = tmp_path_factory.mktemp("report")
    experiment = load(tmp, {"model.d_k": [16, 64], "model.scale": ["sqrt", "none"]}, SEEDS,
                      {"x": "model.d_k", "arm": "model.scale"})
    for seed, (status, curve) in NONE_64.items():
        write_run(experiment, {"model.d_k": 64, "model.scale": "none"}, seed, curve, status)
    for seed in SEEDS:
        write_run(experiment, {"model.d_k": 64, "model.scale": "sqrt"}, seed, kept(10 + 10 * (seed % 2)))
    write_run(experiment, {"model.d_k": 16, "model.scale": "sqrt"}, 0, kept(10))
    sqrt_16 = next(c for c in experiment.cells if c.name == "d_k-16_scale-sqrt_seed-1")
    write_run(experiment, dict(sqrt_16.settings), 1, kept(90), config=replace(sqrt_16.config, **{"optim.lr": 0.7}))
    write_run(experiment, {"model.d_k": 16, "model.scale": "none"}, 0, kept(20))
    none_16 = next(c for c in experiment.cells if c.name == "d_k-16_scale-none_seed-1")
    write_run(experiment, dict(none_16.settings), 1, kept(40), config=replace(none_16.config, runs_dir="elsewhere"))
    return experiment


def names(experiment):
    """The report's short name of each grid key."""
    return short_names(list(experiment.grid_keys))


def finite(values):
    return [v for v in values if not math.isnan(v)]


def stat_text(values, n_finished):
    """format_stat's text, computed here from the values."""
    text = f"{np.mean(values):.3g} ± {np.std(values, ddof=1):.2g}"
    return text + (f" ({len(values)}/{n_finished})" if len(values) < n_finished else "")


def test_table_counts_only_finished_seeds_and_no_final_figures_after_divergence(headline):
    results, _ = collect(headline)
    rows = {(row["d_k"], row["scale"]): row
            for row in table_rows(results, ["model.d_k", "model.scale"], names(headline))}
    row = rows[(64, "none")]
    finished = {seed: curve for seed, (status, curve) in NONE_64.items() if status != "interrupted"}
    completed = [curve for seed, curve in finished.items() if NONE_64[seed][0] == "completed"]
    assert row["seeds"] == 8 and row["status"] == "5 completed, 2 diverged, 1 interrupted"
    assert row["final eval loss"] == stat_text([c[-1][1] for c in completed], len(finished))
    assert row["final eval acc"] == stat_text([c[-1][2] for c in completed], len(finished)), "no garbage accuracy"
    best_acc = [max(a for _, loss, a in c if not math.isnan(loss)) for c in finished.values()]
    assert 0.3 not in best_acc and row["best eval acc"] == stat_text(best_acc, len(finished))
    assert row["best eval loss"] == stat_text([min(finite([loss for _, loss, _ in c])) for c in finished.values()],
                                              len(finished))
    reached = [20, 30, 40]  # seeds 0, 1 and 7
    assert row["steps to 99%"] == f"{np.mean(reached):.0f} ± {np.std(reached, ddof=1):.0f}; never 4/7"
    assert rows[(64, "sqrt")]["steps to 99%"] == "15 ± 5" and rows[(64, "sqrt")]["score std @init"] == "4 ± 0"


def test_conclusion_names_each_fate_and_bounds_the_slowdown(headline):
    results, _ = collect(headline)
    lines = conclusion(results, ["model.d_k"], ["model.scale"], names(headline))
    censored = (20 + 30 + 40 + 4 * BUDGET) / 7  # never = budget
    fastest = 15
    assert lines[lines.index("- **d_k = 64**") + 1:] == [
        "  - scale=sqrt: 8/8 seeds reached 99%, in 15 steps on average.",
        f"  - scale=none: 3/7 seeds reached 99%, those in 30 steps on average (≥ {censored / fastest:.1f}× the fastest "
        f"arm, counting never as {BUDGET} steps); 1 of them ended below 99% (final eval acc 0.800), 1 of them "
        "diverged after reaching 99%; of the 4 that did not: 1 never left the plateau (best eval loss 2.45), "
        "1 learned, then lost it (best eval acc 0.950), 1 left the plateau, ended short of 99% (final eval acc "
        "0.900), 1 diverged; not counted: 1 interrupted.",
    ]
    assert lines[:3] == ["- **d_k = 16**", "  - scale=sqrt: 1/1 seeds reached 99%, in 10 steps on average.",
                         "  - scale=none: 2/2 seeds reached 99%, in 30 steps on average (3.0× the fastest arm)."]


def test_no_ratio_when_no_arm_has_every_seed_there(tmp_path):
    experiment = load(tmp_path, {"model.d_k": [64], "model.scale": ["sqrt", "none"]}, [0, 1],
                      {"x": "model.d_k", "arm": "model.scale"})
    for scale in ("sqrt", "none"):
        write_run(experiment, {"model.d_k": 64, "model.scale": scale}, 0, kept(20))
        write_run(experiment, {"model.d_k": 64, "model.scale": scale}, 1, NONE_64[3][1])
    lines = conclusion(collect(experiment)[0], ["model.d_k"], ["model.scale"], names(experiment))
    assert lines[1] == ("  - scale=sqrt: 1/2 seeds reached 99%, those in 20 steps on average; of the 1 that did "
                        "not: 1 never left the plateau (best eval loss 2.45).")


def test_report_leaves_out_runs_made_with_another_config_and_lists_them(headline):
    results, excluded = collect(headline)
    cell = next(c for c in headline.cells if c.name == "d_k-16_scale-sqrt_seed-1")
    assert [(e.name, e.reason) for e in excluded] == [
        (cell.name, f"config differs from the experiment's: optim.lr: 0.7 -> {cell.config.optim.lr!r}")]
    by_cell = {(r.settings["model.d_k"], r.settings["model.scale"]): r for r in results}
    assert [s.seed for s in by_cell[(16, "sqrt")].seeds] == [0]
    assert [s.seed for s in by_cell[(16, "none")].seeds] == [0, 1], "a run elsewhere is the same run"
    text = write_report(headline)["md"].read_text()
    assert "## Runs left out (1)" in text and "## Expectations, tested" in text
    assert f"- `{cell.name}`: config differs from the experiment's: optim.lr: 0.7 -> {cell.config.optim.lr!r}" in text
    assert f"19 runs of {len(headline.cells)} from" in text and "(18 finished)" in text


def test_expectations_only_for_d_k_against_the_scale_and_count_diverged_among_the_stuck(headline):
    results, _ = collect(headline)
    references = build_task(headline.cells[0].config).reference_losses()
    checks = expectation_check(results, ["model.d_k"], ["model.scale"], references, names(headline))
    assert checks[:2] == [
        "- Scaled runs learn at every d_k: confirmed — 9/9 seeds reached 99%, the slowest in 20 steps.",
        f"- Unscaled runs at the largest d_k (64) fail to learn in most seeds: confirmed — 4/7 did not reach 99% "
        f"within {BUDGET} steps (1 of them diverged).",
    ]
    assert checks[2].startswith(f"- Unscaled runs take longer to leave the no-retrieval plateau "
                                f"({references['no_retrieval']:.3f} nats) as d_k grows")
    for x, arms in ((["model.scale"], ["model.d_k"]), (["model.qk_gain"], ["model.scale"]),
                    (["model.d_k", "model.qk_gain"], ["model.scale"]), (["model.d_k"], ["model.scale", "model.qk_gain"])):
        assert expectation_check(results, x, arms, references, names(headline)) == [], (x, arms)


def test_select_best_by_steps_to_99_with_never_as_the_budget(tmp_path):
    """Per scale, four rates: the old rule (lowest final loss) would take 0.01,
    dropping the never-seed would take 0.1; never = budget takes 1.0 (0.1 costs
    (30 + 30 + 100)/3 > 50), and 1.0 beats 3.0 on final loss alone."""
    experiment = load(tmp_path, {"optim.lr": [0.01, 0.1, 1.0, 3.0], "model.scale": ["none", "sqrt"]}, [0, 1, 2],
                      {"x": "model.scale", "best_of": "optim.lr"})
    plan = {0.01: [[START, (80, 0.02, 0.995), (BUDGET, 0.001, 1.0)]] * 3,
            0.1: [kept(30), kept(30), NONE_64[3][1]],
            1.0: [[START, (50, 0.02, 0.995), (BUDGET, 0.01, 1.0)]] * 3,
            3.0: [[START, (50, 0.02, 0.995), (BUDGET, 0.02, 1.0)]] * 3}
    for lr, curves in plan.items():
        for seed, curve in enumerate(curves):
            write_run(experiment, {"optim.lr": lr, "model.scale": "none"}, seed, curve)
            write_run(experiment, {"optim.lr": lr, "model.scale": "sqrt"}, seed, kept(10 if lr == 3.0 else 40))
    results, _ = collect(experiment)
    x, arms, best_of = layout(experiment)
    assert (x, arms, best_of) == (["model.scale"], [], "optim.lr")
    chosen = {r.settings["model.scale"]: r.settings["optim.lr"] for r in select_best(results, best_of)}
    assert chosen == {"none": 1.0, "sqrt": 3.0}
    assert edge_notes(results, best_of, names(experiment)) == [
        "- scale=sqrt: `optim.lr` = 3 is the highest value tried (0.01, 0.1, 1, 3): the best may lie beyond the grid."]


def test_a_grid_over_a_mapping_field_reports(tmp_path):
    """Used to fail with TypeError: unhashable type: 'dict'."""
    grid = {"optim.lr_mult": [{"W_q": 0.1, "W_k": 0.1}, {"W_q": 1.0, "W_k": 1.0}], "model.scale": ["none"]}
    experiment = load(tmp_path, grid, [0], {"x": "optim.lr_mult", "arm": "model.scale"})
    for mult, step in ((0.1, 60), (1.0, 20)):
        write_run(experiment, {"optim.lr_mult": {"W_q": mult, "W_k": mult}, "model.scale": "none"}, 0, kept(step))
    assert all(re.fullmatch(r"[A-Za-z0-9._=-]+", path.name) for path in experiment.directory.iterdir())
    text = write_report(experiment)["md"].read_text()
    assert "| {W_k: 0.1, W_q: 0.1} | none | 1 |" in text
    assert "- **lr_mult = {W_k: 1, W_q: 1}**" in text


def test_an_unreadable_run_is_left_out_with_the_reason(tmp_path):
    experiment = load(tmp_path, {"model.scale": ["sqrt"]}, [0, 1], {"x": "model.scale"})
    write_run(experiment, {"model.scale": "sqrt"}, 0, kept(20))
    broken = write_run(experiment, {"model.scale": "sqrt"}, 1, kept(20))
    (experiment.directory / broken.name / "summary.json").write_text("{torn")
    results, excluded = collect(experiment)
    assert [len(r.seeds) for r in results] == [1]
    assert [e.name for e in excluded] == [broken.name] and "summary.json: unreadable" in excluded[0].reason
