"""attn export --mlflow, read back with MLflow's own client (MlflowClient on the SQLite store): every param,
metric and artifact against the run directory; exporting again; a run still training; a damaged run."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from board_runs import write_run
from matplotlib.image import imsave

from attn import cli
from attn.analysis import grouping
from attn.config.yamlio import parse_yaml
from attn.store import runs

pytestmark = pytest.mark.slow  # MLflow's import and its store's migrations: make test-slow

mlflow_export = ViewType = MlflowClient = None  # imported by the fixture below when a test here runs


@pytest.fixture(scope="module", autouse=True)
def mlflow_installed():
    """MLflow (and attn.report.mlflow_export, which imports it) imported as a test of this module starts: the
    import costs ~1.5 CPU-s, which every make test worker paid as it collected the module, running its tests
    or not."""
    global mlflow_export, ViewType, MlflowClient
    pytest.importorskip("mlflow", reason="the mlflow package is not installed (optional: attn[mlflow])")
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    from attn.report import mlflow_export


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
    """A directory in memory (/dev/shm) where there is one, else under pytest's: SQLite syncs each of MLflow's
    many transactions to the disk, seconds on a busy one, which a store in memory skips."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path_factory.mktemp("stores")
        return
    path = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="attn-test-mlflow-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def empty_store(memory):
    """A store with MLflow's tables, made once (its dozens of migrations) and copied for each test."""
    mlflow_export.open_store(memory / "empty.db")
    return memory / "empty.db"


@pytest.fixture
def store(empty_store, memory):
    path = Path(tempfile.mkdtemp(dir=memory)) / "mlflow.db"
    shutil.copy(empty_store, path)
    return path


def finish(run_dir, outcome):
    """summary.json as a run that ended writes it (its outcome included), and a figure."""
    summary = {**runs.read_summary(run_dir), "outcome": outcome, "started_at": 1.7e9, "updated_at": 1.7e9 + 5}
    runs.write_json(run_dir / "summary.json", summary)
    imsave(run_dir / "loss.png", np.linspace(0, 1, 12).reshape(3, 4))
    return run_dir


@pytest.fixture
def exp(tmp_path):
    finish(write_run(tmp_path / "runs" / "exp" / "s0", "seed=0", steps=100), "learned")
    finish(write_run(tmp_path / "runs" / "exp" / "s1", "seed=1", "model.scale=none", steps=100), "stalled")
    write_run(tmp_path / "runs" / "exp" / "live", "seed=2", status="running", steps=100, logged_until=40)
    return tmp_path / "runs"


def read_back(store, experiment="exp"):
    client = MlflowClient(tracking_uri=mlflow_export.tracking_uri(store))
    found = client.get_experiment_by_name(experiment)
    return client, {run.info.run_name: run for run in client.search_runs([found.experiment_id])}


def test_every_param_metric_tag_and_artifact_reads_back_with_mlflows_client(exp, store, tmp_path, capsys):
    assert cli.main(["export", str(exp), "--mlflow", str(store)]) == 0
    out = capsys.readouterr()
    assert f"mlflow ui --backend-store-uri sqlite:///{store}" in out.err
    assert sum("running, not finished" in line for line in out.out.splitlines()) == 1
    client, read = read_back(store)
    assert sorted(read) == ["live", "s0", "s1"]
    for name, mlflow_run in read.items():
        run = grouping.load_run(exp / "exp" / name)
        params = mlflow_run.data.params
        assert params.keys() == run.settings.keys()
        assert all(parse_yaml(params[key], key) == value for key, value in run.settings.items())
        keys = {key for record in run.records for key in record} - {"step"}
        assert mlflow_run.data.metrics.keys() == keys
        for key in keys:
            history = sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run.info.run_id, key))
            assert history == [(r["step"], r[key]) for r in run.records if runs.is_finite_number(r.get(key))]
        assert mlflow_run.data.tags.get("outcome") == run.summary.get("outcome")
        assert mlflow_run.data.tags["attn.status"] == run.status
        assert mlflow_run.info.status == ("RUNNING" if name == "live" else "FINISHED")
        files = {f.path for f in client.list_artifacts(mlflow_run.info.run_id)}
        assert files == {"config.yaml", "summary.json"} | ({"loss.png"} if name != "live" else set())
        for file in files:
            copy = client.download_artifacts(mlflow_run.info.run_id, file, str(tmp_path))
            assert open(copy, "rb").read() == (run.path / file).read_bytes()
    assert mlflow_export.artifacts_root(store).is_dir()


def test_exporting_again_adds_only_new_steps_and_a_changed_run_is_replaced(exp, store, capsys):
    assert cli.main(["export", str(exp), "--mlflow", str(store)]) == 0
    _, first = read_back(store)
    runs.append_metrics(exp / "exp" / "live", {"step": 50, "eval_loss": 0.5})  # the live run trained on
    assert cli.main(["export", str(exp), "--mlflow", str(store)]) == 0
    assert cli.main(["export", str(exp), "--mlflow", str(store)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("(")[-1].split(",")[1].split(" of")[0].strip() for line in printed[3:]] == [
        "1 new",
        "0 new",
        "0 new",
        "0 new",
        "0 new",
        "0 new",
    ]
    client, again = read_back(store)
    assert {name: run.info.run_id for name, run in again.items()} == {n: r.info.run_id for n, r in first.items()}
    live = again["live"].info.run_id
    assert sorted(m.step for m in client.get_metric_history(live, "eval_loss")) == [0, 10, 20, 30, 40, 50]
    assert sorted(m.step for m in client.get_metric_history(live, "train_loss")) == [0, 10, 20, 30, 40]
    records = runs.read_metrics(exp / "exp" / "live")  # resumed from an earlier checkpoint: its records differ
    records[2]["eval_loss"] = 9.0
    (exp / "exp" / "live" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli.main(["export", str(exp), "--mlflow", str(store)]) == 0
    client, replaced = read_back(store)
    assert replaced["live"].info.run_id != live and replaced["s0"].info.run_id == first["s0"].info.run_id
    history = client.get_metric_history(replaced["live"].info.run_id, "eval_loss")
    assert sorted((m.step, m.value) for m in history)[2] == (20, 9.0)
    deleted = client.search_runs([replaced["live"].info.experiment_id], run_view_type=ViewType.DELETED_ONLY)
    assert [run.info.run_id for run in deleted] == [live]


def test_an_export_killed_before_its_end_is_replaced_by_the_next(exp, store, capsys, monkeypatch):
    log_batch = MlflowClient.log_batch

    def killed_at_the_tags(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        if tags:
            raise KeyboardInterrupt
        return log_batch(self, run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", killed_at_the_tags)
    assert cli.main(["export", str(exp / "exp" / "s0"), "--mlflow", str(store)]) == 130
    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)
    assert cli.main(["export", str(exp / "exp" / "s0"), "--mlflow", str(store)]) == 0
    client, read = read_back(store)
    assert list(read) == ["s0"] and read["s0"].data.tags["attn.exported"].startswith("11 ")
    deleted = client.search_runs([read["s0"].info.experiment_id], run_view_type=ViewType.DELETED_ONLY)
    assert len(deleted) == 1 and deleted[0].info.run_id != read["s0"].info.run_id


def test_a_damaged_run_is_one_line_and_skipped_and_the_others_exported(exp, store, capsys):
    (exp / "exp" / "s1" / "summary.json").write_text("{not json")
    assert cli.main(["export", str(exp), "--mlflow", str(store)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err if line.startswith("skipped")] == [f"skipped {exp / 'exp' / 's1'}"]
    assert "summary.json" in err[0]
    assert sorted(read_back(store)[1]) == ["live", "s0"]


def test_a_file_that_is_no_sqlite_store_or_a_missing_mlflow_is_refused_in_one_line(exp, tmp_path, capsys, monkeypatch):
    notes = tmp_path / "notes.md"
    notes.write_text("# not a database\n")
    assert cli.main(["export", str(exp), "--mlflow", str(notes)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --mlflow {notes}: is not an SQLite database")
    assert notes.read_text() == "# not a database\n"
    monkeypatch.setattr(mlflow_export, "MlflowClient", None)  # as the module leaves it when the import fails
    assert cli.main(["export", str(exp), "--mlflow", str(tmp_path / "new.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --mlflow: needs the mlflow package")
    assert not (tmp_path / "new.db").exists()
