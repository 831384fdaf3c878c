"""The training loop (issue 3): determinism, a short run that learns, and what
a run directory holds."""

import contextlib
import io
import json
import platform
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import PNG_SIGNATURE, TINY, facts_in, without_timing

from attn import cli
from attn.cli import common
from attn.config.loading import build_spec, build_task, load_config
from attn.config.schema import to_dict
from attn.model import fast
from attn.store import arrayfiles, locks, runs, runstate
from attn.train import lifecycle, loop

REPO = Path(__file__).resolve().parents[1]


def train_tiny(runs_dir, name, *overrides):
    config = load_config(None, [*TINY, f"runs_dir={runs_dir}", "train.steps=40", "logging.log_every=5", *overrides])
    run_dir = lifecycle.create(config, name=name)
    loop.train(config, run_dir)
    return runs.read_metrics(run_dir)


def test_same_config_and_seed_give_bit_identical_metrics(tmp_path):
    first = train_tiny(tmp_path, "a")
    again = train_tiny(tmp_path, "b")
    other_seed = train_tiny(tmp_path, "c", "seed=1")
    assert len(first) == len(again) > 2
    assert without_timing(first) == without_timing(again)
    assert [r["train_loss"] for r in first] != [r["train_loss"] for r in other_seed]


def test_a_diverged_record_stores_no_meaningless_accuracy_or_diagnostics(tmp_path):
    """NaN logits have an argmax (class 0): the record must not call that an accuracy."""
    records = train_tiny(tmp_path, "blowup", "model.scale=none", "model.qk_gain=8", "optim.lr=5")
    last = records[-1]
    assert "nonfinite" in last and last["eval_loss"] is None, last
    for key in ("eval_accuracy", "score_std", "attn_entropy", "saturated_frac", "target_attn"):
        assert last[key] is None, (key, last[key])
    summary = runs.read_summary(tmp_path / "blowup")
    assert summary["status"] == "diverged" and summary["final"]["eval_accuracy"] is None
    assert all(r["eval_accuracy"] is not None for r in records[:-1])


@pytest.mark.parametrize("asked", [None, "2"])
def test_attn_train_trains_with_one_blas_thread_unless_the_environment_asks_and_says_so(tmp_path, asked):
    """A run from the command line trains with one BLAS thread, as a sweep's workers do (its bits are then the
    sweep cell's, and no second thread spins for a busy core), unless OPENBLAS_NUM_THREADS asks for more; its
    provenance records the count, which a run continued from it takes."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in common.THREAD_VARIABLES}
    env |= {"CI": "true", "PYTHONPATH": str(REPO)} | ({"OPENBLAS_NUM_THREADS": asked} if asked else {})
    command = [sys.executable, "-m", "attn", "train", *TINY, "train.steps=2", "--name", "r"]
    done = subprocess.run(command + [f"runs_dir={tmp_path}"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    provenance = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["provenance"]
    threads = 1 if asked is None else min(int(asked), os.cpu_count() or 1)
    assert provenance["blas_threads"] == threads
    # a fork (as a resume) goes on with the threads its source recorded, the environment asking for none
    env = {k: v for k, v in env.items() if k not in common.THREAD_VARIABLES}
    fork = [sys.executable, "-m", "attn", "train", "--fork", str(tmp_path / "r"), "train.steps=4", "--name", "f"]
    done = subprocess.run(fork + [f"runs_dir={tmp_path}"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load((tmp_path / "f" / "config.yaml").read_text())["provenance"]["blas_threads"] == threads


def test_norms_do_not_depend_on_blas_threads():
    """Logged norms use numpy's pairwise sum, not a BLAS dot whose threaded
    reduction order would change the last bits."""
    from threadpoolctl import threadpool_limits

    from attn import optim

    g = np.random.default_rng(0).standard_normal((512, 1024), dtype=np.float32)
    with threadpool_limits(limits=1):
        one = optim.squared_norm(g)
    with threadpool_limits(limits=2):
        two = optim.squared_norm(g)
    assert one == two == float(np.sum(g.astype(np.float64) ** 2))


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """The default config for a few steps, through the CLI's main."""
    runs_dir = tmp_path_factory.mktemp("runs")
    config_path = str(REPO / "configs/default.yaml")
    overrides = [f"runs_dir={runs_dir}", "train.steps=50", "logging.log_every=25"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["train", config_path, *overrides, "--name", "learn"])
    return dict(
        code=code,
        stdout=out.getvalue(),
        stderr=err.getvalue(),
        run_dir=runs_dir / "learn",
        overrides=overrides,
        config=load_config(config_path, overrides),
    )


def test_a_short_run_of_the_default_config_learns_retrieval(learned):
    assert learned["code"] == common.EXIT_OK, learned["stderr"]
    summary = runs.read_summary(learned["run_dir"])
    assert summary["status"] == "completed"
    assert summary["final"]["eval_accuracy"] >= 0.95
    assert summary["final"]["eval_loss"] < summary["references"]["no_retrieval"] / 10
    first = runs.read_metrics(learned["run_dir"])[0]
    assert first["eval_accuracy"] < 0.5  # it was learned, not there from the start


def test_the_cli_prints_the_run_directory_as_its_last_line(learned):
    assert learned["stdout"].splitlines()[-1] == str(learned["run_dir"])
    assert "Traceback" not in learned["stderr"]


def test_the_run_directory_holds_every_file_and_nothing_half_written(learned):
    names = {p.name for p in learned["run_dir"].iterdir()}
    assert {
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "checkpoint.npz",
        "loss.png",
        "attention.png",
        "diagnostics.png",
        "mechanism.png",
        "mechanism_trace.npz",
    } <= names
    assert not [n for n in names if n.endswith(".tmp") or n.startswith(".") and n != locks.LOCK_NAME]
    assert (learned["run_dir"] / locks.LOCK_NAME).read_bytes() == b""  # released: no holder recorded
    for figure in ("loss.png", "attention.png", "diagnostics.png", "mechanism.png"):
        assert (learned["run_dir"] / figure).read_bytes().startswith(PNG_SIGNATURE)


def test_config_yaml_is_the_resolved_config_with_provenance(learned):
    stored = yaml.safe_load((learned["run_dir"] / "config.yaml").read_text())
    provenance = stored.pop("provenance")
    assert stored == to_dict(learned["config"])
    assert provenance["overrides"] == learned["overrides"]
    assert provenance["python"] == platform.python_version()
    assert provenance["numpy"] == np.__version__
    assert lifecycle.config_of(learned["run_dir"]) == learned["config"]


def param_names(config):
    return list(fast.param_shapes(build_spec(config, build_task(config))))


def test_metrics_records_carry_every_logged_figure(learned):
    config = learned["config"]
    records = runs.read_metrics(learned["run_dir"])
    log_every, steps = config.logging.log_every, config.train.steps
    assert [r["step"] for r in records] == list(range(0, steps + 1, log_every))
    names = param_names(config)
    always = {
        "step",
        "lr",
        "train_loss",
        "train_accuracy",
        "eval_loss",
        "eval_accuracy",
        "wall_time",
        "steps_per_sec",
        "score_std",
        "attn_entropy",
        "saturated_frac",
        "self_attn",
        "grad_norm",
        *(f"grad_norm/{n}" for n in names),
    }
    for record in records:
        assert always <= record.keys()
    for record in records[:-1]:  # the last step only measures: no update, no ratio
        assert {f"update_ratio/{n}" for n in names} <= record.keys()
    lines = (learned["run_dir"] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records


def test_summary_has_status_final_and_best_figures_and_speed(learned):
    summary = runs.read_summary(learned["run_dir"])
    records = runs.read_metrics(learned["run_dir"])
    assert summary["step"] == summary["steps"] == learned["config"].train.steps
    assert summary["final"]["eval_loss"] == records[-1]["eval_loss"]
    assert summary["best"]["eval_accuracy"] == max(r["eval_accuracy"] for r in records)
    assert summary["best"]["eval_loss"] == min(r["eval_loss"] for r in records)
    assert summary["wall_time"] > 0 and summary["steps_per_sec"] > 0
    assert locks.effective_status(summary) == "completed"


def test_checkpoint_loads_without_pickle_and_matches_the_model(learned):
    config = learned["config"]
    spec = build_spec(config, build_task(config))
    arrays = arrayfiles.load_arrays(learned["run_dir"] / "checkpoint.npz")
    for name, shape in fast.param_shapes(spec).items():
        assert arrays[f"param/{name}"].shape == shape
        assert arrays[f"param/{name}"].dtype == np.dtype(config.dtype)
    assert json.loads(str(arrays["meta"]))["step"] == config.train.steps


def test_attention_snapshots_hold_every_row_and_the_query_rows_training_computes(learned):
    """Training computes the attention of the query rows only; the snapshot for
    the figure has all T rows, and its query rows are the ones training uses."""
    config, run_dir = learned["config"], learned["run_dir"]
    state = runstate.prepare(config, run_dir, resume=True)  # final params and the eval set; writes nothing
    n, T = config.logging.attention_examples, state.spec.n_positions
    snapshots = arrayfiles.load_arrays(run_dir / "attention.npz")
    for when in ("init", "final"):
        assert snapshots[f"attn_{when}"].shape == (n, T, T)
        np.testing.assert_allclose(snapshots[f"attn_{when}"].sum(axis=-1), 1, atol=1e-5)
    _, cache = fast.forward(state.params, state.spec, state.eval_batch)
    query_rows = cache["attn"]["attn"][:n]  # (n, 1, T): retrieval's query, computed alone
    assert query_rows.shape == (n, 1, T) and cache["positions"].tolist() == [T - 1]
    np.testing.assert_allclose(snapshots["attn_final"][:, T - 1 :], query_rows, rtol=1e-4, atol=1e-6)


def test_a_field_name_without_a_value_is_not_taken_for_a_config_file(tmp_path, capsys):
    code = cli.main(["train", "optim.lr", f"runs_dir={tmp_path}"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and facts_in(err, "optim.lr:", "no such config file", "optim.lr=VALUE")
    assert not any(tmp_path.iterdir())


def test_the_mechanism_is_measured_at_its_step_whether_or_not_that_step_is_logged(tmp_path):
    config = load_config(
        None,
        [
            "train.steps=20",
            "logging.log_every=25",
            "logging.mechanism_step=10",
            "logging.plots=false",
            f"runs_dir={tmp_path}",
            "task.eval_size=32",
        ],
    )
    run_dir = lifecycle.create(config, name="mech")
    lifecycle.execute(config, run_dir)
    steps = {name.split("/")[0] for name in arrayfiles.load_arrays(run_dir / "mechanism.npz")}
    assert steps == {"0", "10"}
    assert [r["step"] for r in runs.read_metrics(run_dir)] == [0, 20], "step 10 is measured, not logged"
