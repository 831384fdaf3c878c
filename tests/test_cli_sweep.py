"""Sweeps from the command line (`attn sweep CONFIG --grid ... --seeds ...`)
and the sweep's progress: starts, outcomes, skips, a bar only over the runs
to train, the one-line summary (issue 14, items 5 and 7)."""

import io
import queue
import shutil
import types
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from helpers import facts_in

from attn import cli
from attn.cli import common
from attn.cli import sweeps as cli_sweeps
from attn.config.yamlio import ConfigError
from attn.experiment import spec as experiments
from attn.experiment import sweep
from attn.experiment.report_spec import ReportSpec
from attn.report import experiment_figures
from attn.store import runs

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "default.yaml"
TINY = [
    "model.d_model=16",
    "task.eval_size=32",
    "train.batch_size=16",
    "train.steps=10",
    "logging.log_every=5",
    "logging.plots=false",
    "logging.attention_examples=0",
]


def call(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "text, seeds", [("0-4", [0, 1, 2, 3, 4]), ("0,2,5", [0, 2, 5]), ("0-2,7", [0, 1, 2, 7]), ("3", [3])]
)
def test_seeds_are_ranges_and_lists(text, seeds):
    assert experiments.parse_seeds(text) == seeds


@pytest.mark.parametrize(
    "text, message",
    [
        ("4-0", "a range goes from low to high"),
        ("a", "expected integers >= 0"),
        ("0,0", "seed 0 is given twice"),
        ("-1", "expected integers >= 0"),
        ("0-99999999", "more seeds than the limit"),
    ],
)
def test_bad_seeds_are_one_line(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        experiments.parse_seeds(text)
    assert str(err.value).startswith(f"--seeds: got {text!r}")


def test_grid_values_are_typed_as_overrides_are():
    assert experiments.parse_grid_argument("model.d_k=16,64,256") == ("model.d_k", [16, 64, 256])
    assert experiments.parse_grid_argument("optim.lr=1e-3,0.1") == ("optim.lr", [0.001, 0.1])
    assert experiments.parse_grid_argument("optim.lr_mult={W_q: 0.1},{W_k: 2}") == (
        "optim.lr_mult",
        [{"W_q": 0.1}, {"W_k": 2}],
    )
    for text, message in (
        ("model.dk=16", "did you mean `model.d_k`?"),
        ("seed=0,1", "set with --seeds"),
        ("model.d_k", "expected KEY=VALUE,VALUE"),
        ("model.d_k=[1", "not valid YAML"),
    ):
        with pytest.raises(ConfigError, match=message):
            experiments.parse_grid_argument(text)


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory):
    """attn sweep CONFIG --grid ... --grid ... --seeds 0-1 through cli.main, one worker process. Its report draws
    no figures (most of a report's time; the tests here read its lines, and tests/test_report.py the figures)."""
    root = tmp_path_factory.mktemp("cli_sweep")
    argv = [
        "sweep",
        CONFIG,
        "--grid",
        "model.d_k=4,8",
        "--grid",
        "model.scale=sqrt",
        "--seeds",
        "0-1",
        *TINY,
        "--runs-dir",
        root / "runs",
        "--workers",
        "1",
    ]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(experiment_figures, "draw_all", lambda *args, **kwargs: {})
        err = io.StringIO()
        monkeypatch.setattr("sys.stderr", err)
        out = io.StringIO()
        monkeypatch.setattr("sys.stdout", out)
        code = cli.main([str(a) for a in argv])
    return root, argv, code, out.getvalue(), err.getvalue()


def test_a_command_line_grid_runs_and_writes_the_experiment_file_it_ran(grid_sweep):
    root, _, code, out, err = grid_sweep
    directory = root / "runs" / "default-d_k-scale"
    assert code == common.EXIT_OK, err
    assert out.splitlines()[-1] == str(directory)
    data = yaml.safe_load((directory / "experiment.yaml").read_text())
    assert data["base"] == str(CONFIG) and Path(data["base"]).is_absolute()
    assert data["grid"] == {"model.d_k": [4, 8], "model.scale": ["sqrt"]} and data["seeds"] == [0, 1]
    assert data["overrides"]["runs_dir"] == str(root / "runs") and data["overrides"]["train.steps"] == 10
    made = sorted(p.name for p in directory.iterdir() if p.is_dir())
    assert made == [f"d_k-{d}_scale-sqrt_seed-{s}" for d in (4, 8) for s in (0, 1)]
    assert all(runs.read_summary(directory / name)["status"] == "completed" for name in made)
    assert f"experiment file: {directory / 'experiment.yaml'}" in err


def test_the_sweep_prints_starts_and_ends_then_a_short_summary_and_the_report_path(grid_sweep):
    root, _, _, _, err = grid_sweep
    lines = err.splitlines()
    started = [i for i, line in enumerate(lines) if line.startswith("started ")]
    ended = [i for i, line in enumerate(lines) if line.startswith("[")]
    assert len(ended) == 4 and started and started[0] < ended[0]  # a stack is named when it starts, before its ends
    assert "(done 0, running " in lines[started[0]] and lines[started[0]].endswith("failed 0; of 4)")
    summary = lines[ended[-1] + 1]
    assert summary == "sweep default-d_k-scale: 4 runs: 4 completed"
    assert lines[-1] == f"report: {root / 'runs' / 'default-d_k-scale' / 'report.md'}"
    assert "## " not in err  # the report itself is not printed


def test_running_its_file_again_skips_everything_in_one_line(grid_sweep, capsys, monkeypatch):
    root, _, _, _, _ = grid_sweep
    path = root / "runs" / "default-d_k-scale" / "experiment.yaml"
    monkeypatch.setattr(sweep, "default_executor", lambda workers: ThreadPoolExecutor(1))  # nothing to train
    monkeypatch.setattr(experiment_figures, "draw_all", lambda *args, **kwargs: {})  # its report's are not read
    code, out, err = call(capsys, "sweep", path)
    assert code == common.EXIT_OK, err
    assert "sweep default-d_k-scale: nothing to run: all 4 runs had finished (4 completed)" in err.splitlines()
    assert not any(line.startswith("started ") for line in err.splitlines())
    before = path.read_text()
    for grid in (["model.d_k=4,8", "model.scale=sqrt"], ["model.d_k=4,16", "model.scale=sqrt"]):
        experiment, data = experiments.command_line_experiment(CONFIG, grid, "0-1", None, TINY, str(root / "runs"))
        assert experiment.path == path
        if grid[0] == "model.d_k=4,8":  # the same command line again: the same experiment, its file kept
            experiments.save_experiment_file(path, data)
        else:
            with pytest.raises(ConfigError) as err:
                experiments.save_experiment_file(path, data)
            assert facts_in(str(err.value), f"{path}:", "another experiment", "grid", f"attn sweep {path}")
        assert path.read_text() == before


def outcome(cell: str, action: str, status: str) -> sweep.CellAction:
    return sweep.CellAction(cell, action, status, "detail")


def test_the_bar_counts_only_runs_to_train_and_never_a_run_that_did_not_start(capsys):
    progress = cli_sweeps.SweepProgress(6, interactive=True)
    for name in ("a", "b"):
        progress.ended_with(outcome(name, "skipped-finished", "completed"))
    assert progress.bar is None  # nothing trained yet: no bar
    progress.started(["c", "d"])
    assert (progress.bar.n, progress.bar.total) == (0, 4) and list(progress.running) == ["c", "d"]
    progress.ended_with(outcome("c", "ran", "completed"))
    progress.ended_with(outcome("d", "ran", "interrupted"))
    progress.ended_with(outcome("e", "cancelled", "not started"))
    progress.ended_with(outcome("f", "failed", "failed"))
    assert (progress.bar.n, progress.bar.total) == (3, 4)  # e never started: not done, still owed
    assert progress.tally() == "done 1, running 0, skipped 2, failed 1, interrupted 1"
    progress.close()
    err = capsys.readouterr().err
    assert "[4/6] d: ran, interrupted  detail" in err and "[6/6] f: failed, failed  detail" in err


def test_an_all_skipped_sweep_draws_no_bar(capsys):
    progress = cli_sweeps.SweepProgress(3, interactive=True)
    for name in "abc":
        progress.ended_with(outcome(name, "skipped-finished", "completed"))
    progress.close()
    assert progress.bar is None and capsys.readouterr().err == ""
    experiment = types.SimpleNamespace(name="exp")
    nothing = cli_sweeps.sweep_summary(experiment, [outcome(n, "skipped-finished", "completed") for n in "ab"])
    assert nothing.startswith("sweep exp: ") and facts_in(nothing, "nothing to run", "2 runs", "2 completed")
    ran = [
        outcome("a", "skipped-finished", "completed"),
        outcome("b", "ran", "diverged"),
        outcome("c", "skipped-locked", "running"),
    ]
    summary = cli_sweeps.sweep_summary(experiment, ran)
    assert summary.startswith("sweep exp: ") and facts_in(summary, "3 runs", "1 completed", "1 diverged")
    assert facts_in(summary, "1 running in another sweep", "1 of them had finished before")


def test_a_start_that_comes_after_its_cells_ended_is_dropped(tmp_path, monkeypatch):
    """A quick stack's result may overtake its start on the LocalPool's
    queue: stack a ends at once and its start comes late; stack b starts,
    then ends. Only b's start is reported."""
    futures = {"a": Future(), "b": Future()}
    futures["a"].set_result([sweep.CellAction("a", "ran", "completed")])

    class Started:  # the queue: nothing, then a's late start (as b's stack is handed its result), then b's
        def __init__(self):
            self.calls = 0

        def get_nowait(self):
            self.calls += 1
            if self.calls == 2:
                futures["b"].set_result([sweep.CellAction("b", "ran", "completed")])
                return ["a"]
            if self.calls == 3:
                return ["b"]
            raise queue.Empty

    executor = types.SimpleNamespace(started=Started(), submit=lambda fn, stack, *args: futures[stack[0].name])
    cells = [types.SimpleNamespace(name=name, seed=0) for name in "ab"]
    monkeypatch.setattr(sweep, "plan_stacks", lambda cells: [[cell] for cell in cells])
    starts, ends = [], []
    sweep.run_experiment(
        types.SimpleNamespace(cells=cells, directory=tmp_path, path=tmp_path / "x.yaml", report=ReportSpec((), ())),
        executor,
        ends.append,
        on_start=starts.append,
    )
    assert [o.cell for o in ends] == ["a", "b"] and starts == [["b"]]


def test_the_report_is_summed_up_by_its_verdicts_and_its_path(tmp_path, monkeypatch, capsys):
    from attn.report import experiment_report

    judged = [
        {"id": "scaled-wins", "claim": "the scaled arm wins", "verdict": "confirmed"},
        {"id": "fast", "claim": "it is fast\nat d_k 16", "verdict": "not confirmed"},
    ]
    runs.write_json(tmp_path / "report.json", {"expectations": judged})
    monkeypatch.setattr(
        experiment_report,
        "write_report",
        lambda experiment, known=None: {"json": tmp_path / "report.json", "md": tmp_path / "report.md"},
    )
    cli_sweeps.print_report(None)
    assert capsys.readouterr().err.splitlines() == [
        "    confirmed  scaled-wins: the scaled arm wins",
        "not confirmed  fast: it is fast\\nat d_k 16",
        f"report: {tmp_path / 'report.md'} (2 expectations judged)",
    ]


def test_only_runs_part_of_an_experiment_and_a_report_counts_either_algorithms_run_as_the_cells(
    tmp_path, capsys, monkeypatch
):
    """--only runs the cells of some grid values; the report covers the whole experiment. Runs of one cell made
    width-free and materialized (model.width_free, an `algorithm` field) are both the cell's runs, and the
    report says which way each was carried. Its reports draw no figures (most of a report's time; read here
    is report.json)."""
    monkeypatch.setattr(experiment_figures, "draw_all", lambda *args, **kwargs: {})
    base = tmp_path / "base.yaml"
    base.write_text(
        "task: {name: retrieval, n_pairs: 4, eval_size: 32}\nmodel: {d_model: 8}\n"
        "train: {steps: 10, batch_size: 16}\nlogging: {log_every: 5, plots: false, attention_examples: 0}\n"
    )
    (tmp_path / "e.yaml").write_text(
        yaml.safe_dump({"name": "e", "base": "base.yaml", "grid": {"model.d_k": [64, 256]}, "seeds": [0, 1]})
    )
    common_args = ["sweep", tmp_path / "e.yaml", "--runs-dir", tmp_path / "runs", "--workers", "1"]
    code, _, err = call(capsys, *common_args, "--only", "model.d_k=64", "model.width_free=false")
    assert code == 0 and "2 runs" in err
    assert sorted(p.name for p in (tmp_path / "runs" / "e").iterdir() if p.is_dir()) == [
        "d_k-64_seed-0",
        "d_k-64_seed-1",
    ]
    code, _, err = call(capsys, *common_args, "--only", "model.d_k=256", "--no-report")  # a part: no report
    assert code == 0 and "--no-report" in err
    assert [c["settings"]["model.d_k"] for c in runs.read_report_json(tmp_path / "runs" / "e")["cells"]] == [64], (
        "the report is the first pass's still"
    )
    assert call(capsys, "report", tmp_path / "e.yaml", "--runs-dir", tmp_path / "runs")[0] == 0  # every cell
    report = runs.read_report_json(tmp_path / "runs" / "e")
    assert sum(len(c["seeds"]) for c in report["cells"]) == 4
    assert report["platform"]["W_q, W_k"] == ["materialized", "width-free: coordinates of the drawn weights"]
    assert "cells with runs carried both ways" not in report["platform"]
    shutil.rmtree(tmp_path / "runs" / "e" / "d_k-64_seed-1")  # made again width-free: its cell holds both ways
    code, _, err = call(capsys, *common_args, "--only", "model.d_k=64")
    assert code == 0 and "1 of them had finished before (skipped)" in err  # seed 0, made materialized, is the cell's
    report = runs.read_report_json(tmp_path / "runs" / "e")  # of the d_k 64 cell alone
    assert report["platform"]["cells with runs carried both ways"] == ["1 (model.d_k=64, ...)"]
    code, _, err = call(capsys, *common_args, "--only", "model.d_k=32")
    assert code == 2 and "--only" in err and "64, 256" in err


def test_a_report_asks_each_run_about_longer_contexts_with_the_runs_own_config(tmp_path, capsys, monkeypatch):
    """A run of the cell made with the other algorithm (materialized W_q, W_k of width d_k) is restored from
    its checkpoint by its own config, not the cell's (width-free coordinates). Its report draws no figures (read
    here is report.json, whose lengths rows come from the restored runs)."""
    monkeypatch.setattr(experiment_figures, "draw_all", lambda *args, **kwargs: {})
    (tmp_path / "base.yaml").write_text(
        "task: {name: retrieval, n_pairs: 4, n_keys: 128, eval_size: 32}\nmodel: {d_model: 8, positional: none}\n"
        "train: {steps: 10, batch_size: 16}\nlogging: {log_every: 5, plots: false, attention_examples: 0}\n"
    )
    (tmp_path / "e.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "e",
                "base": "base.yaml",
                "grid": {"model.d_k": [64], "model.scale": ["sqrt", "none"]},
                "seeds": [0],
                "report": {"x": "model.d_k", "arm": "model.scale", "lengths": [4, 8]},
            }
        )
    )
    common_args = ["sweep", tmp_path / "e.yaml", "--runs-dir", tmp_path / "runs", "--workers", "1"]
    assert call(capsys, *common_args, "--only", "model.scale=sqrt", "model.width_free=false", "--no-report")[0] == 0
    code, _, err = call(capsys, *common_args, "--only", "model.scale=none", "--no-report")
    assert code == 0, err
    assert call(capsys, "report", tmp_path / "e.yaml", "--runs-dir", tmp_path / "runs")[0] == 0
    report = runs.read_report_json(tmp_path / "runs" / "e")
    assert report["platform"]["W_q, W_k"] == ["materialized", "width-free: coordinates of the drawn weights"]
    assert sorted((row["arm"], sorted(row["pairs"])) for row in report["lengths"]) == [
        (["none"], ["4", "8"]),
        (["sqrt"], ["4", "8"]),
    ]
