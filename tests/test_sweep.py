"""Experiments: validation before any run, parallel execution, skip/resume,
locking, failures that don't stop the others, Dask, the report, the
miniature headline ablation, and the scaled/unscaled equivalence."""

import csv
import fcntl
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import without_timing

from attn import cli, outcomes
from attn.analysis.results import collect
from attn.config.loading import load_config
from attn.config.schema import to_dict
from attn.config.yamlio import ConfigError
from attn.experiment import spec as experiments
from attn.experiment import sweep
from attn.report.experiment_report import write_report
from attn.store import runs
from attn.train import lifecycle
from attn.train.loop import StopFlag, train

ROOT = Path(__file__).resolve().parent.parent

FAST = {
    "train.steps": 30,
    "logging.log_every": 10,
    "logging.checkpoint_every": 10,
    "logging.plots": False,
    "task.eval_size": 64,
    "model.d_model": 16,
}


def write_experiment(tmp_path, name="exp", grid=None, seeds=(0, 1), overrides=None, report=None, base=None):
    data = {
        "name": name,
        "base": str(base or ROOT / "configs" / "default.yaml"),
        "overrides": {**FAST, **(overrides or {})},
        "grid": grid if grid is not None else {"model.d_k": [4, 8], "model.scale": ["sqrt", "none"]},
        "seeds": list(seeds),
    }
    if report:
        data["report"] = report
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ---------------------------------------------------------------------------
# Validation happens before any run
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "grid,message",
    [
        ({}, "grid: expected a non-empty mapping"),
        ([], "grid: expected a non-empty mapping"),
        ({"model.dk": [4]}, "did you mean `model.d_k`?"),
        ({"seed": [1, 2]}, "set with `seeds:`"),
        ({"model.d_k": 4}, "expected a non-empty list of values"),
        ({"model.d_k": [4, 0]}, "grid cell {model.d_k: 0}: model.d_k: got 0; expected an integer > 0"),
        ({"task.n_pairs": [4, 40]}, "grid cell {task.n_pairs: 40}: task.n_pairs: got 40; expected at most task.n_keys"),
    ],
)
def test_bad_grids_are_refused_before_any_run(tmp_path, grid, message):
    path = write_experiment(tmp_path, grid=grid)
    with pytest.raises(ConfigError) as err:
        experiments.load_experiment(path, str(tmp_path / "runs"))
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_bad_seeds_and_missing_keys_are_refused(tmp_path):
    for seeds, message in (
        ([], r"seeds: got \[\]"),
        ([1, 1], "distinct"),
        (["a"], "seeds: got .a.; expected an integer >= 0"),
    ):
        path = write_experiment(tmp_path, seeds=seeds)
        with pytest.raises(ConfigError, match=message):
            experiments.load_experiment(path)
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nbase: nowhere.yaml\ngrid: {model.d_k: [4]}\nseeds: [0]\n")
    with pytest.raises(ConfigError, match="nowhere.yaml: no such config file"):
        experiments.load_experiment(path)
    path.write_text("name: x\ngrid: {model.d_k: [4]}\nseeds: [0]\n")
    with pytest.raises(ConfigError, match="missing `base`"):
        experiments.load_experiment(path)
    path.write_text("name: ../x\nbase: b.yaml\ngrid: {model.d_k: [4]}\nseeds: [0]\n")
    with pytest.raises(ConfigError, match="name: got '../x'"):
        experiments.load_experiment(path)


def test_cli_reports_a_bad_cell_in_one_line_and_runs_nothing(tmp_path, capsys):
    path = write_experiment(tmp_path, grid={"optim.lr": [0.1, -1.0]})
    code = cli.main(["sweep", str(path), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "optim.lr: got -1.0" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "report,message",
    [
        ({"x": "model.dk"}, "report: x: `model.dk` is not a key of the grid; did you mean `model.d_k`?"),
        (
            {"arm": ["model.scale", "model.scal"]},
            "report: arm: `model.scal` is not a key of the grid; did you mean `model.scale`?",
        ),
        (
            {"best_of": "optim.lr"},
            "report: best_of: `optim.lr` is not a key of the grid; expected one of model.d_k, model.scale",
        ),
        ({"xx": "model.d_k"}, "report: unknown key `xx`; did you mean `x`?"),
        ({"best": "model.d_k"}, "report: unknown key `best`; did you mean `best_of`?"),
        ({"best_of": ["model.d_k"]}, "report: best_of: got ['model.d_k']; expected one grid key"),
        ({"x": []}, "report: x: got []; expected a grid key or a list of grid keys"),
        ({"x": "model.d_k", "arm": "model.d_k"}, "report: arm: `model.d_k` is already the report's x"),
        ({"x": "model.d_k", "best_of": "model.d_k"}, "report: best_of: `model.d_k` is already the report's x"),
    ],
)
def test_report_section_typos_are_refused_in_one_line(tmp_path, report, message):
    """A typo in `report:` used to give a column of None; now it is refused before any run."""
    with pytest.raises(ConfigError) as err:
        experiments.load_experiment(write_experiment(tmp_path, report=report), str(tmp_path / "runs"))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_mapping_value_makes_a_shell_safe_run_name(tmp_path):
    grid = {"optim.lr_mult": [{"W_q": 0.1, "W_k": 0.1}, {"W_k": 1.0, "W_q": 1.0}]}
    experiment = experiments.load_experiment(write_experiment(tmp_path, grid=grid, seeds=[0]))
    assert [c.name for c in experiment.cells] == ["lr_mult-W_k0.1-W_q0.1_seed-0", "lr_mult-W_k1-W_q1_seed-0"]
    assert experiments.cell_name((("task.mode", "a b/c'{}"),), 1, ["task.mode"]) == "mode-a_b_c____seed-1"
    same = {"optim.lr_mult": [{"W_q": 0.1, "W_k": 0.1}, {"W_k": 0.1, "W_q": 0.1}]}
    with pytest.raises(ConfigError, match="appears twice"):
        experiments.load_experiment(write_experiment(tmp_path, grid=same, seeds=[0]))


def test_grid_cells_names_and_union_of_products(tmp_path):
    grid = [{"model.d_k": [4, 8], "model.scale": ["sqrt"]}, {"model.d_k": [16], "optim.lr": [0.1, 1e-2]}]
    experiment = experiments.load_experiment(write_experiment(tmp_path, grid=grid, seeds=[3]))
    names = [c.name for c in experiment.cells]
    assert names == [
        "d_k-4_scale-sqrt_seed-3",
        "d_k-8_scale-sqrt_seed-3",
        "d_k-16_lr-0.1_seed-3",
        "d_k-16_lr-0.01_seed-3",
    ]
    assert experiment.cells[3].config.optim.lr == 0.01 and experiment.cells[3].config.model.d_k == 16
    assert all(c.config.seed == 3 and c.config.train.steps == FAST["train.steps"] for c in experiment.cells)


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A 2 x 2 x 2 sweep run once through the CLI with two worker processes
    (its report written by the test that reads it)."""
    tmp = tmp_path_factory.mktemp("sweep")
    path = write_experiment(tmp)
    code = cli.main(["sweep", str(path), "--runs-dir", str(tmp / "runs"), "--workers", "2", "--no-report"])
    assert code == 0
    return experiments.load_experiment(path, str(tmp / "runs"))


def test_every_cell_is_a_normal_run_directory(finished_sweep):
    for cell in finished_sweep.cells:
        run_dir = finished_sweep.directory / cell.name
        summary = runs.read_summary(run_dir)
        assert summary["status"] == "completed" and summary["step"] == FAST["train.steps"]
        assert len(runs.read_metrics(run_dir)) == FAST["train.steps"] // FAST["logging.log_every"] + 1
        stored = load_config(run_dir / "config.yaml")
        assert stored == cell.config


def test_rerun_skips_finished_and_resumes_interrupted(finished_sweep):
    first = finished_sweep.cells[0]
    run_dir = finished_sweep.directory / first.name
    expected = runs.read_metrics(run_dir)
    shutil.rmtree(run_dir)
    run_dir.mkdir()
    runs.write_config(run_dir, to_dict(first.config), {})
    stop = StopFlag()
    summary = lifecycle.execute(
        first.config, run_dir, stop=stop, progress=lambda step, record: stop.request("SIGINT") if step == 12 else None
    )
    assert summary["status"] == "interrupted" and summary["step"] == 13
    outcomes = {o.cell: o for o in sweep.run_experiment(finished_sweep, ThreadPoolExecutor(2))}
    assert outcomes[first.name].action == "resumed" and outcomes[first.name].status == "completed"
    assert all(o.action == "skipped-finished" for name, o in outcomes.items() if name != first.name)
    assert without_timing(runs.read_metrics(run_dir)) == without_timing(expected)


def test_a_cell_locked_by_another_sweep_is_skipped(tmp_path):
    experiment = experiments.load_experiment(
        write_experiment(tmp_path, grid={"model.d_k": [4]}, seeds=[0]), str(tmp_path / "runs")
    )
    cell = experiment.cells[0]
    run_dir = experiment.directory / cell.name
    run_dir.mkdir(parents=True)
    with open(run_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        outcome = sweep.run_cells([cell], str(experiment.directory), str(experiment.path))[0]
    assert outcome.action == "skipped-locked"
    assert not (run_dir / "metrics.jsonl").exists()


def test_a_failing_run_is_reported_and_does_not_stop_the_others(tmp_path):
    experiment = experiments.load_experiment(
        write_experiment(tmp_path, grid={"model.d_k": [4, 8]}, seeds=[0]), str(tmp_path / "runs")
    )
    experiment.directory.mkdir(parents=True)
    (experiment.directory / experiment.cells[0].name).write_text("a file where the run directory should be")
    seen = []
    outcomes = sweep.run_experiment(experiment, ThreadPoolExecutor(2), seen.append)
    by_name = {o.cell: o for o in outcomes}
    assert by_name[experiment.cells[0].name].action == "failed"
    assert "FileExistsError" in by_name[experiment.cells[0].name].detail
    assert by_name[experiment.cells[1].name].status == "completed"
    assert len(seen) == 2


def test_a_changed_config_is_not_silently_resumed(finished_sweep, tmp_path):
    changed = experiments.load_experiment(
        write_experiment(tmp_path, overrides={"optim.lr": 0.25}), str(finished_sweep.directory.parent)
    )
    cell = changed.cells[0]
    runs_dir = finished_sweep.directory / cell.name
    status = runs.read_summary(runs_dir)
    runs.write_json(runs_dir / "summary.json", dict(status, status="interrupted"))
    try:
        outcome = sweep.run_cells([cell], str(finished_sweep.directory), str(changed.path))[0]
    finally:
        runs.write_json(runs_dir / "summary.json", status)
    assert outcome.action == "failed" and "optim.lr: 0.5 -> 0.25" in outcome.detail


def test_a_finished_run_with_a_changed_config_is_not_reused(finished_sweep, tmp_path):
    """An edited experiment file used to reuse the old finished runs silently."""
    changed = experiments.load_experiment(
        write_experiment(tmp_path, overrides={"optim.lr": 0.25}), str(finished_sweep.directory.parent)
    )
    cell = changed.cells[0]
    before = runs.read_summary(finished_sweep.directory / cell.name)
    outcome = sweep.run_cells([cell], str(finished_sweep.directory), str(changed.path))[0]
    assert (outcome.action, outcome.status) == ("failed", "config-changed")
    assert "optim.lr: 0.5 -> 0.25" in outcome.detail and "the run completed" in outcome.detail
    assert runs.read_summary(finished_sweep.directory / cell.name) == before, "the run is left as it was"


def test_a_finished_run_is_reused_when_only_result_neutral_keys_changed(finished_sweep, tmp_path):
    changed = experiments.load_experiment(
        write_experiment(tmp_path, overrides={"logging.plots": True, "logging.checkpoint_every": 5}),
        str(finished_sweep.directory.parent),
    )
    outcome = sweep.run_cells([changed.cells[0]], str(finished_sweep.directory), str(changed.path))[0]
    assert (outcome.action, outcome.status) == ("skipped-finished", "completed")


def test_dask_local_cluster_runs_the_same_sweep(tmp_path):
    distributed = pytest.importorskip("distributed")
    experiment = experiments.load_experiment(
        write_experiment(tmp_path, grid={"model.d_k": [4, 8]}, seeds=[0]), str(tmp_path / "runs")
    )
    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        outcomes = sweep.run_experiment(experiment, client.get_executor())
    assert sorted(o.status for o in outcomes) == ["completed", "completed"]
    for cell in experiment.cells:
        assert runs.read_summary(experiment.directory / cell.name)["status"] == "completed"


def test_executor_address_must_be_dask():
    with pytest.raises(ConfigError, match="expected dask://HOST:PORT"):
        sweep.executor_from_address("tcp://localhost:1")


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------
def test_report_figures_and_table_come_from_the_run_directories(finished_sweep):
    paths = write_report(finished_sweep)
    for key in ("md", "csv", "json", "headline", "final_loss", "loss_curves", "mechanism"):
        assert paths[key].exists() and paths[key].stat().st_size > 0
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == 4
    for row in rows:
        cells = [
            c
            for c in finished_sweep.cells
            if c.config.model.d_k == int(row["d_k"]) and c.config.model.scale == row["scale"]
        ]
        finals = [runs.read_summary(finished_sweep.directory / c.name)["final"]["eval_loss"] for c in cells]
        assert row["median final loss [95%]"].startswith(f"{np.median(finals):.3g} [")
        assert int(row["seeds"]) == len(cells) == sum(int(row[n]) for n in outcomes.OUTCOMES)
    data = json.loads(paths["json"].read_text())
    assert len(data["cells"]) == 4 and data["platform"]["dtype"] == ["float32"]
    text = paths["md"].read_text()
    assert "## In one paragraph (generated)" in text and data["headline"] in text


def test_report_without_runs_says_so(tmp_path, capsys):
    path = write_experiment(tmp_path)
    assert cli.main(["report", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "no finished runs of this experiment yet" in capsys.readouterr().err


def test_miniature_headline_ablation_shows_the_effect(tmp_path):
    """A large d_k, few steps, two seeds: from the data it produced, the
    unscaled arm starts saturated and learns slower than the scaled one."""
    path = write_experiment(
        tmp_path,
        name="mini",
        grid={"model.d_k": [512], "model.scale": ["sqrt", "none"]},
        seeds=[0, 1],
        overrides={
            "model.d_model": 32,
            "model.d_v": 16,
            "optim.lr": 0.3,
            "train.steps": 150,
            "logging.log_every": 10,
            "task.eval_size": 128,
        },
        report={"x": "model.d_k", "arm": "model.scale"},
    )
    assert cli.main(["sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--workers", "2", "--no-report"]) == 0
    experiment = experiments.load_experiment(path, str(tmp_path / "runs"))
    collected, excluded = collect(experiment, experiments.config_change)
    assert excluded == []
    results = {(r.settings["model.d_k"], r.settings["model.scale"]): r for r in collected}
    big_sqrt, big_none = results[(512, "sqrt")], results[(512, "none")]
    assert np.mean(big_none.at_init("score_std")) > 10 * np.mean(big_sqrt.at_init("score_std"))
    assert np.mean(big_none.at_init("saturated_frac")) > np.mean(big_sqrt.at_init("saturated_frac"))
    assert np.mean(big_none.at_init("attn_entropy")) < np.mean(big_sqrt.at_init("attn_entropy"))
    reached = {
        arm: [s.outcome.reached_step for s in cell.seeds] for arm, cell in (("sqrt", big_sqrt), ("none", big_none))
    }
    assert all(s is not None for s in reached["sqrt"]), "the scaled arm learns"
    slower = [n is None or n > s for n, s in zip(reached["none"], reached["sqrt"])]
    assert all(slower), reached
    assert np.mean(big_none.final_losses()) > 5 * np.mean(big_sqrt.final_losses())
    saturated = {
        arm: np.median(cell.mechanism(0, "saturated_frac")) for arm, cell in (("sqrt", big_sqrt), ("none", big_none))
    }
    assert saturated["none"] > 0.3 > saturated["sqrt"] == 0, saturated


# ---------------------------------------------------------------------------
# Equivalence: unscaled with W_q, W_k init x d_k^-1/4 and lr x d_k^-1/2 on them
# is, under plain SGD, the scaled model written differently.
# ---------------------------------------------------------------------------
def test_unscaled_with_reparametrised_qk_equals_scaled(tmp_path):
    d_k = 64
    common = [
        "dtype=float64",
        "train.steps=40",
        "logging.log_every=1",
        "logging.plots=false",
        "task.eval_size=64",
        "model.d_model=32",
        f"model.d_k={d_k}",
        "optim.lr=0.3",
        "logging.attention_examples=0",
    ]
    scaled = load_config(None, common + ["model.scale=sqrt"])
    factor = d_k**-0.5
    unscaled = load_config(
        None,
        common + ["model.scale=none", f"model.qk_gain={d_k**-0.25}", f"optim.lr_mult={{W_q: {factor}, W_k: {factor}}}"],
    )
    losses = []
    for name, config in (("scaled", scaled), ("unscaled", unscaled)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        train(config, run_dir)
        records = runs.read_metrics(run_dir)
        losses.append(np.array([[r["train_loss"], r["eval_loss"], r["score_std"]] for r in records]))
    assert losses[0].shape == (41, 3)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-10, atol=0)
    assert not np.allclose(losses[0][0, 0], losses[0][-1, 0]), "the runs actually trained"
