"""A sweep whose executor loses its stacks (a Dask scheduler gone: tested
for real in tests/test_faults.py) without this sweep having stopped them:
every such cell is `unknown (the scheduler was lost)`, never `cancelled,
not started`; `attn sweep` says so in one line, exits 1, writes no report."""

from concurrent.futures import Executor, Future
from pathlib import Path

import yaml

from attn import cli
from attn.cli import common
from attn.experiment import spec as experiments
from attn.experiment import sweep

REPO = Path(__file__).resolve().parents[1]


class LostCluster(Executor):
    """Every stack handed to it comes back cancelled by the cluster, whose scheduler is gone."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = Future()
        future.cancel()
        future.set_running_or_notify_cancel()
        return future

    def lost(self) -> str:
        return "the scheduler was lost"


def experiment_file(tmp_path: Path) -> Path:
    path = tmp_path / "lost.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "lost",
                "base": str(REPO / "configs" / "default.yaml"),
                "overrides": {"model.d_model": 16, "train.steps": 10},
                "grid": {"model.d_k": [8, 16]},
                "seeds": [0, 1],
            }
        )
    )
    return path


def test_stacks_the_executor_lost_are_unknown_not_not_started(tmp_path):
    experiment = experiments.load_experiment(experiment_file(tmp_path), str(tmp_path / "runs"))
    outcomes = sweep.run_experiment(experiment, LostCluster())
    assert sorted((o.cell, o.action, o.status, o.detail) for o in outcomes) == sorted(
        (c.name, "unknown", "unknown (the scheduler was lost)", "the scheduler was lost") for c in experiment.cells
    )


def test_attn_sweep_on_a_lost_scheduler_says_so_in_one_line_and_writes_no_report(tmp_path, monkeypatch, capsys):
    path = experiment_file(tmp_path)
    monkeypatch.setattr(sweep, "executor_from_address", lambda address: LostCluster())
    monkeypatch.setattr("sys.argv", ["attn", "sweep", str(path), "--executor", "dask://127.0.0.1:8786"])
    code = cli.main(["sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--executor", "dask://127.0.0.1:8786"])
    err = capsys.readouterr().err.splitlines()
    assert code == common.EXIT_FAILED
    assert err[-1] == (
        "error: the Dask scheduler at dask://127.0.0.1:8786 was lost mid-sweep: what became of 4 of 4 "
        "runs is unknown (a worker may still be training them), so no report is written; run the same "
        f"command again to finish the rest: attn sweep {path} --executor dask://127.0.0.1:8786"
    )
    assert err[-2] == "sweep lost: 4 runs: 4 unknown (the scheduler was lost)"
    assert sum(line.endswith(": unknown (the scheduler was lost)") for line in err) == 4
    assert not (tmp_path / "runs" / "lost" / "report.json").exists()
