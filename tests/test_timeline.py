"""A sweep's timeline (attn.experiment.timeline): what it records per stack and phase, the arithmetic of
its summary on a synthetic timeline, its figure; the plan's even stacks and split tail, which change no
run; the report's runs read ahead, which change no report; the bench's headline sweep in a child."""

import json
import threading

import numpy as np
import pytest
import yaml
from helpers import PNG_SIGNATURE, TINY, without_timing

from attn import cli
from attn.analysis import results
from attn.experiment import spec as experiments
from attn.experiment import sweep, timeline
from attn.report import experiment_figures
from attn.store import arrayfiles, runs

STEPS = ["train.steps=12", "logging.log_every=4", "logging.checkpoint_every=6"]


def write_experiment(tmp_path, seeds, grid=None, name="tl"):
    grid = grid or {"optim.lr": [0.1, 0.3]}
    overrides = dict(item.split("=", 1) for item in [*TINY, *STEPS])
    data = {
        "name": name,
        "base": str(tmp_path / "base.yaml"),
        "overrides": {k: yaml.safe_load(v) for k, v in overrides.items() if k not in grid},
        "grid": grid,
        "seeds": list(seeds),
    }
    (tmp_path / "base.yaml").write_text("task: {name: retrieval}\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sweep through the CLI on 2 workers, report included; the report's reads of runs outside the
    read-ahead thread counted; the figures its report drew (name -> path)."""
    tmp = tmp_path_factory.mktemp("timeline")
    path = write_experiment(tmp, seeds=range(5))
    read, cell_run, drawn, draw_all = [], results.cell_run, {}, experiment_figures.draw_all

    def counted(*args, **kwargs):
        read.append(threading.current_thread().name)
        return cell_run(*args, **kwargs)

    def drawing(*args, **kwargs):
        drawn.update(draw_all(*args, **kwargs))
        return drawn

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(results, "cell_run", counted)
        patch.setattr(experiment_figures, "draw_all", drawing)
        assert cli.main(["sweep", str(path), "--runs-dir", str(tmp / "runs"), "--workers", "2"]) == 0
    assert drawn, "the sweep's report drew its figures"
    return experiments.load_experiment(path, str(tmp / "runs")), read, dict(drawn)


def test_a_sweep_records_its_phases_and_each_stack(swept):
    experiment, _, _ = swept
    records = timeline.read_timeline(experiment.directory / timeline.TIMELINE_FILE)
    assert [r["event"] for r in records][:1] == ["sweep"] and records[-1]["event"] == "end"
    assert [r["name"] for r in records if r["event"] == "phase"] == ["start-up", "plan", "train", "report"]
    stacks = [r for r in records if r["event"] == "stack"]
    planned = sweep.split_tail(sweep.plan_stacks(experiment.cells), 2)
    assert sorted(r["stack"] for r in stacks) == list(range(len(planned)))
    assert sorted(r["cells"] for r in stacks) == sorted(len(s) for s in planned)
    assert sum(r["trained_cells"] for r in stacks) == len(experiment.cells) == records[0]["runs"]
    for r in stacks:
        assert r["start"] <= r["trained"] <= r["end"] and r["cpu"] > 0 and r["cpu_total"] >= r["cpu"]
        assert r["writes"] > 0 and len(r["write_moments"]) >= 3  # claimed, checkpoints, final summaries
        assert all(0 <= offset <= r["end"] - r["start"] for offset, _ in r["write_moments"])
    summary = timeline.summarise(records)
    assert summary["workers"] == 2 and summary["stacks"] == len(planned)
    assert summary["cores_busy"] == summary["cpu_s"] / summary["wall_s"]
    assert sum(summary["core_idle_s"].values()) == pytest.approx(2 * summary["wall_s"] - summary["cpu_s"])


def test_the_sweeps_report_reads_no_run_again_and_is_the_report_of_its_runs(swept, capsys, monkeypatch):
    experiment, read, drawn = swept
    assert len(read) == len(experiment.cells) and set(read) == {"report read-ahead"}
    written = {name: (experiment.directory / name).read_bytes() for name in ("report.json", "report.md")}
    # The report made again from the runs alone, its figures not drawn again (most of a report's time): the files
    # the sweep's report drew are named, as they were, in the report.md compared here.
    monkeypatch.setattr(experiment_figures, "draw_all", lambda *args, **kwargs: dict(drawn))
    assert cli.main(["report", str(experiment.path), "--runs-dir", str(experiment.directory.parent)]) == 0
    assert {name: (experiment.directory / name).read_bytes() for name in written} == written


def test_a_run_read_ahead_is_read_again_once_its_files_change(swept):
    experiment, _, _ = swept
    cell = experiment.cells[0]
    run_dir = experiment.directory / cell.name
    known = results.KnownRuns(experiments.result_change)
    known.read(run_dir, cell)
    kind, seed = known.entry(run_dir, experiments.result_change, known.threshold)
    assert kind == "seed" and seed.seed == cell.seed
    assert known.entry(run_dir, experiments.config_change, known.threshold) is None  # read for another rule
    assert known.entry(run_dir, experiments.result_change, 0.5) is None  # at another threshold
    runs.write_json(run_dir / "summary.json", {**runs.read_summary(run_dir), "note": "rewritten"})
    assert known.entry(run_dir, experiments.result_change, known.threshold) is None


def synthetic() -> list[dict]:
    """Two workers; A trains two stacks (a gap of 0.5 s between), B one that ends 2 s before A's last."""
    sweep_id = {"sweep": "s"}
    stack = {"event": "stack", "write_moments": [], "cells": 1, "trained_cells": 1, "worker_start": 0.5, **sweep_id}
    # worker, start, training began, end, CPU-s in the stack, of it while preparing, worker's CPU-s so far, writes
    stacks = [
        ("A", 2.0, 2.5, 6.0, 3.0, 0.25, 4.0, 0.5),
        ("B", 2.2, 2.4, 8.0, 5.5, 0.2, 6.5, 0.2),
        ("A", 6.5, 7.0, 10.0, 3.2, 0.4, 7.2, 0.3),
    ]
    fields = ("worker", "start", "trained", "end", "cpu", "cpu_preparing", "cpu_total", "writes")
    return [
        {"event": "sweep", "start": 0.0, "workers": 2, "cores": 2, "runs": 3, **sweep_id},
        {"event": "phase", "name": "start-up", "start": 0.0, "end": 1.0, "cpu": 0.5, **sweep_id},
        {"event": "phase", "name": "plan", "start": 1.0, "end": 1.5, "cpu": 0.25, **sweep_id},
        *({**stack, **dict(zip(fields, values))} for values in stacks),
        {"event": "phase", "name": "train", "start": 1.5, "end": 10.2, "cpu": 0.1, **sweep_id},
        {"event": "phase", "name": "report", "start": 10.5, "end": 12.0, "cpu": 1.5, **sweep_id},
        {"event": "end", "end": 12.0, "cpu_self": 2.5, "cpu_children": 0.0, **sweep_id},
    ]


def test_cores_busy_and_idle_time_by_cause_of_a_synthetic_timeline():
    summary = timeline.summarise(synthetic())
    assert summary["wall_s"] == 12.0 and summary["cpu_s"] == pytest.approx(2.5 + 7.2 + 6.5)
    assert summary["cores_busy"] == pytest.approx(16.2 / 12)
    idle = summary["core_idle_s"]
    # before the first stacks: 2 + 2.2 slot-seconds, less the main's start-up and plan CPU and each worker's imports
    assert idle["start"] == pytest.approx(4.2 - 0.75 - 2 * 1.0)
    assert idle["waiting"] == pytest.approx(0.5) and idle["tail"] == pytest.approx(2.0)
    # after the last stack: 2 slots x 2 s, less the main's CPU then (its report, and 0.15 CPU-s in no phase)
    assert idle["end"] == pytest.approx(4.0 - 1.5 - 0.15)
    assert idle["writes"] == pytest.approx(1.0)
    assert idle["preparing"] == pytest.approx((0.5 - 0.25) + (0.2 - 0.2) + (0.5 - 0.4))  # off the CPU while preparing
    assert sum(idle.values()) == pytest.approx(2 * 12.0 - 16.2)
    assert summary["stack_seconds"] == pytest.approx(4.0 + 5.8 + 3.5) and summary["preparing_s"] == pytest.approx(1.2)


def test_the_timeline_read_is_the_last_sweeps_and_a_torn_line_is_skipped(tmp_path):
    path = tmp_path / timeline.TIMELINE_FILE
    older = [{**r, "sweep": "older"} for r in synthetic()]
    path.write_text("".join(json.dumps(r) + "\n" for r in [*older, *synthetic()]) + '{"sweep": "s", "eve')
    assert timeline.read_timeline(path) == synthetic()


def test_the_timeline_figure_is_drawn(tmp_path):
    records = synthetic()
    path = tmp_path / "timeline.png"
    from attn.report.timeline_figure import draw_timeline

    draw_timeline(records, timeline.summarise(records), path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_the_plan_stacks_evenly_and_splits_its_tail(tmp_path):
    experiment = experiments.load_experiment(write_experiment(tmp_path, seeds=range(10)), str(tmp_path / "runs"))
    assert [len(s) for s in sweep.plan_stacks(experiment.cells)] == [10, 10]  # 20 cells that stack 16
    sixty = experiments.load_experiment(
        write_experiment(tmp_path, seeds=range(30), name="sixty"), str(tmp_path / "runs")
    )
    plan = sweep.plan_stacks(sixty.cells)
    assert [len(s) for s in plan] == [15, 15, 15, 15]
    split = sweep.split_tail(plan, 2)
    assert [len(s) for s in split] == [15, 15, 15, 8, 7]  # the last: at most half the work left after the third
    assert [c.name for s in split for c in s] == [c.name for s in plan for c in s]
    assert sweep.split_tail(plan, 1) == plan
    assert [len(s) for s in sweep.split_tail(plan, 4)] == [15, 8, 7, 8, 7, 4, 4, 4, 3]


def test_a_split_plan_trains_the_same_runs(tmp_path):
    path = write_experiment(tmp_path, seeds=range(3), grid={"optim.lr": [0.1, 0.3], "model.scale": ["sqrt", "none"]})
    whole = experiments.load_experiment(path, str(tmp_path / "whole"))
    parts = experiments.load_experiment(path, str(tmp_path / "parts"))
    (stack,) = sweep.plan_stacks(whole.cells)
    split = sweep.split_tail([stack], 4)
    assert len(split) == 4
    for directory, stacks in ((whole.directory, [stack]), (parts.directory, split)):
        directory.mkdir(parents=True)
        for cells in stacks:
            assert {o.status for o in sweep.run_cells(cells, str(directory), str(path))} == {"completed"}
    for cell in whole.cells:
        a, b = whole.directory / cell.name, parts.directory / cell.name
        assert without_timing(runs.read_metrics(a)) == without_timing(runs.read_metrics(b))
        ca, cb = arrayfiles.load_arrays(a / "checkpoint.npz"), arrayfiles.load_arrays(b / "checkpoint.npz")
        assert ca.keys() == cb.keys() and all(np.array_equal(ca[k], cb[k]) for k in ca if k != "meta")
        assert runs.read_summary(a)["stack_size"] == len(stack) > runs.read_summary(b)["stack_size"]


@pytest.mark.slow
def test_the_bench_sweeps_the_headline_in_a_child_and_counts_its_cpu(tmp_path):
    from attn.bench import sweeps

    path = write_experiment(tmp_path, seeds=range(2))
    measured = sweeps.headline_sweep(tmp_path / "runs", 2, experiment=path)
    assert measured["exit_code"] == 0 and measured["wall_s"] > 0 and measured["cpu_s"] > 0
    assert measured["cores_busy"] == measured["cpu_s"] / measured["wall_s"]
    assert measured["timeline"]["runs"] == 4 and measured["timeline"]["cpu_s"] <= measured["cpu_s"]
    assert measured["timeline_records"][0]["event"] == "sweep"


def test_the_bench_writes_the_headlines_figures_and_compares_the_codes_it_swept(tmp_path):
    from attn.bench import suite, sweeps

    summary = timeline.summarise(synthetic())
    measured = [
        {"round": 1, "code": sweeps.THIS_CODE, "exit_code": 0, "wall_s": 12.0, "cpu_s": 16.2, "cores_busy": 1.35},
        {"round": 1, "code": "/tmp/before", "exit_code": 0, "wall_s": 15.0, "cpu_s": 18.0, "cores_busy": 1.2},
    ]
    measured[0].update(timeline=summary, timeline_records=synthetic())
    measured[1].update(timeline=None, timeline_records=[])
    headline = {"experiment": "experiments/sqrt_dk.yaml", "only": ["model.d_k=16"], "runs": 3, "workers": 2}
    headline.update(stacks=3, wall_s=12.0, cpu_s=16.2, cores_busy=1.35, efficiency=0.5, measured=measured)
    work = {"only": ["model.d_k=16"], "runs": 3, "head_multiply_adds": 6e9, "matmul_rate_per_core": 1e9, "cores": 2}
    machine = {"cpu": "x", "cores": 2, "blas": "b", "openblas_coretype": None}
    result = {"date": "d", "machine": machine, "rivals": {}, "timings": [], "headline": headline}
    result["work"] = {**work, "least_seconds": 3.0}
    paths = suite.write(result, tmp_path)
    assert paths["json"].name.startswith("headline-") and paths["timeline1"].read_bytes().startswith(PNG_SIGNATURE)
    stored = json.loads(paths["json"].read_text())
    assert [m.get("timeline_records") for m in stored["headline"]["measured"]] == [None, None]
    assert timeline.read_timeline(tmp_path / stored["headline"]["measured"][0]["timeline_files"][1]) == synthetic()
    table = paths["md"].read_text()
    assert "| 1 | /tmp/before | 15.0 | 18.0 | 1.20 | 0 | — |" in table
    assert "1.35 cores busy on average (NOT met at ≥ 1.8)" in table
    assert "16 CPU-s (37% of it per CPU-second)" in table  # the floor's 6 core-seconds over 16.2 CPU-seconds
