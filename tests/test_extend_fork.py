"""Extending a run (`attn train --resume RUN train.steps=N`) and forking one
(`attn train --fork RUN[@STEP] key=value`), through cli.main in-process.

An extended run with a constant schedule is the run trained with the larger
budget from the start, bit for bit; a fork with no change continues exactly
as its source did; every checkpoint a run writes is kept as
checkpoint-<step>.npz for forks to start from.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import TINY, facts_in, without_timing

from attn import cli
from attn.cli import common
from attn.config import schema
from attn.config.loading import load_config
from attn.store import arrayfiles, locks, runs, runstate
from attn.train import lifecycle, loop

# Adam (a step count and moments to carry on), warm-up, a budget that is no multiple of log_every or
# checkpoint_every, and both snapshots (attention at the end, mechanism at a step before the extension);
# every checkpoint kept (logging.keep_checkpoints null), to fork from any (retention: tests/test_retention.py).
RUN = [
    *TINY,
    "optim.name=adam",
    "optim.lr=0.01",
    "optim.warmup_steps=4",
    "logging.log_every=5",
    "logging.checkpoint_every=10",
    "logging.attention_examples=2",
    "logging.mechanism_step=3",
    "logging.keep_checkpoints=null",
]
SHORT, LONG = 22, 40
KEPT = [*range(10, SHORT, 10), SHORT]  # the steps of the short run's checkpoints: every 10th, and the last


def call(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(a) for a in args])
    return code, capsys.readouterr().err


def trained(runs_dir: Path, name: str, *overrides: str) -> Path:
    config = load_config(None, [*RUN, f"runs_dir={runs_dir}", *overrides])
    run_dir = lifecycle.create(config, name=name)
    assert lifecycle.execute(config, run_dir)["status"] == "completed"
    return run_dir


def checkpoint(path: Path) -> tuple[dict, dict]:
    arrays = arrayfiles.load_arrays(path)
    meta = json.loads(str(arrays.pop("meta")))
    meta.pop("wall_time")
    return arrays, meta


def assert_same_arrays(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """The same numbers: records (less timing), last checkpoint (less wall time), snapshots, final figures."""
    assert without_timing(runs.read_metrics(run_dir)) == without_timing(runs.read_metrics(reference))
    (ours, our_meta), (theirs, their_meta) = (
        checkpoint(run_dir / "checkpoint.npz"),
        checkpoint(reference / "checkpoint.npz"),
    )
    assert our_meta == their_meta
    assert_same_arrays(ours, theirs)
    for snapshot in ("attention.npz", "mechanism.npz", loop.MECHANISM_TRACE):
        assert_same_arrays(arrayfiles.load_arrays(run_dir / snapshot), arrayfiles.load_arrays(reference / snapshot))
    summary, expected = runs.read_summary(run_dir), runs.read_summary(reference)
    assert (summary["status"], summary["step"], summary["steps"], summary["final"], summary["best"]) == (
        expected["status"],
        expected["step"],
        expected["steps"],
        expected["final"],
        expected["best"],
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A completed short run and the long reference, trained once for the module."""
    root = tmp_path_factory.mktemp("extend")
    return (
        root,
        trained(root / "runs", "short", f"train.steps={SHORT}"),
        trained(root / "runs", "long", f"train.steps={LONG}"),
    )


@pytest.fixture
def short(made, tmp_path) -> Path:
    _, short_run, _ = made
    return Path(shutil.copytree(short_run, tmp_path / "runs" / "short"))


def test_every_checkpoint_is_kept_by_its_step_and_the_last_is_checkpoint_npz(made):
    _, short_run, _ = made
    assert runstate.kept_checkpoint_steps(short_run) == KEPT
    for step in KEPT:
        assert checkpoint(runstate.checkpoint_file(short_run, step))[1]["step"] == step
    assert (short_run / "checkpoint.npz").read_bytes() == runstate.checkpoint_file(short_run, SHORT).read_bytes()
    assert (short_run / "checkpoint.npz").samefile(runstate.checkpoint_file(short_run, SHORT)), (
        "the last checkpoint is a second name of the kept one, not a second copy of its bytes"
    )


def test_where_there_are_no_hard_links_the_last_checkpoint_is_a_copy(tmp_path, monkeypatch):
    kept, last = tmp_path / "checkpoint-5.npz", tmp_path / "checkpoint.npz"
    kept.write_bytes(b"five")
    last.write_bytes(b"four")

    def no_links(*_):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    runs.link_atomic(kept, last)
    assert last.read_bytes() == b"five" and not last.samefile(kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5.npz", "checkpoint.npz"], "no temporary left"


def test_an_extended_run_is_the_run_trained_with_the_larger_budget_from_the_start(made, short, capsys):
    _, _, long_run = made
    code, err = call(capsys, "train", "--resume", short, f"train.steps={LONG}")
    assert code == common.EXIT_OK, err
    lines = err.splitlines()
    assert lines[0] == f"extending {short}: train.steps {SHORT} -> {LONG} (recorded in its config.yaml)"
    assert lines[1] == f"resuming {short} from step {SHORT}/{LONG}"
    assert_same_run(short, long_run)
    data = runs.read_run_config(short)
    assert data["train"]["steps"] == LONG
    (extension,) = data["provenance"]["extensions"]
    assert (extension["from_steps"], extension["to_steps"]) == (SHORT, LONG) and extension["at"]
    assert runs.read_summary(short)["resumed_from"] == SHORT


def test_an_extension_stopped_before_it_trained_resumes_without_being_asked_again(made, short, capsys):
    """Killed between recording the new budget and training: config.yaml says
    LONG, summary.json still `completed` at SHORT; a plain --resume finishes it."""
    _, _, long_run = made
    with locks.RunLock(short, "test"):
        lifecycle.record_extension(short, lifecycle.check_resumable(short, overrides=[f"train.steps={LONG}"]))
    assert runs.read_summary(short)["status"] == "completed"
    code, err = call(capsys, "train", "--resume", short)
    assert code == common.EXIT_OK and err.splitlines()[0] == f"resuming {short} from step {SHORT}/{LONG}", err
    assert_same_run(short, long_run)


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ([], ["the run already completed", f"extend it: attn train --resume {{run}} train.steps=N with N > {SHORT}"]),
        (
            [f"train.steps={SHORT - 2}"],
            [f"train.steps: {SHORT} -> {SHORT - 2}: a resume can only extend a run", "attn train --fork {run}@STEP"],
        ),
        (
            [f"train.steps={LONG}", "optim.lr=0.1"],
            ["the config differs from the run's (optim.lr: 0.01 -> 0.1", "attn train --fork {run} key=value"],
        ),
    ],
    ids=["no-change", "fewer-steps", "other-change"],
)
def test_resume_refuses_what_is_no_extension_in_one_line(short, capsys, overrides, fragments):
    before = {p.name: p.read_bytes() for p in short.iterdir()}
    code, err = call(capsys, "train", "--resume", short, *overrides)
    assert code == common.EXIT_BAD_INPUT and err.count("\n") == 1 and err.startswith("error: "), err
    for fragment in fragments:
        assert fragment.format(run=short) in err, err
    assert {p.name: p.read_bytes() for p in short.iterdir()} == before


def test_a_cosine_run_is_not_extended(tmp_path, capsys):
    run_dir = trained(tmp_path / "runs", "cosine", "train.steps=6", "optim.schedule=cosine")
    code, err = call(capsys, "train", "--resume", run_dir, "train.steps=12")
    assert code == common.EXIT_BAD_INPUT and err.count("\n") == 1, err
    assert facts_in(err, "train.steps: 6 -> 12", "optim.schedule cosine", "train.steps=12")
    assert runs.read_run_config(run_dir)["train"]["steps"] == 6


def test_a_fork_without_changes_continues_as_its_source_did(made, capsys):
    root, short_run, _ = made
    code, err = call(capsys, "train", "--fork", f"{short_run}@10")
    fork = root / "runs" / "short-fork-10"
    assert code == common.EXIT_OK, err
    assert err.splitlines()[0] == f"forking {short_run} at step 10 into {fork} (no change: it continues as its source)"
    assert_same_run(fork, short_run)
    forked_from = runs.read_run_config(fork)["provenance"]["forked_from"]
    assert (forked_from["run"], forked_from["step"], forked_from["changes"]) == (str(short_run), 10, [])
    assert runs.read_summary(fork)["resumed_from"] == 10


def test_a_fork_of_the_last_checkpoint_with_a_larger_budget_is_the_longer_run(made, tmp_path, capsys):
    root, short_run, long_run = made
    code, err = call(
        capsys, "train", "--fork", short_run, f"train.steps={LONG}", "--name", "longer", f"runs_dir={tmp_path}"
    )
    assert code == common.EXIT_OK, err
    assert_same_run(tmp_path / "longer", long_run)
    assert runs.read_config_dict(tmp_path / "longer")["name"] is None  # not its source's name


def test_a_fork_takes_its_new_rate_from_its_step_on_and_keeps_the_records_before(made, tmp_path, capsys):
    _, short_run, _ = made
    code, err = call(capsys, "train", "--fork", f"{short_run}@10", "optim.lr=0.05", f"runs_dir={tmp_path}")
    assert code == common.EXIT_OK, err
    assert "(optim.lr: 0.01 -> 0.05; runs_dir: " in err.splitlines()[0]
    ours, theirs = runs.read_metrics(tmp_path / "short-fork-10"), runs.read_metrics(short_run)
    assert without_timing(ours[:2]) == without_timing(theirs[:2])  # steps 0 and 5: copied
    assert ours[2]["step"] == 10 and ours[2]["eval_loss"] == theirs[2]["eval_loss"]  # the same parameters at step 10
    assert ours[2]["lr"] == 0.05 and ours[-1]["eval_loss"] != theirs[-1]["eval_loss"]
    attention = arrayfiles.load_arrays(tmp_path / "short-fork-10" / "attention.npz")
    np.testing.assert_array_equal(
        attention["attn_init"], arrayfiles.load_arrays(short_run / "attention.npz")["attn_init"]
    )


@pytest.mark.parametrize(
    "target, overrides, fragments",
    [
        ("@7", [], ["{run}@7", "step 7", ", ".join(map(str, KEPT))]),
        ("@10", ["model.d_k=16"], ["model.d_k: 8 -> 16", "shapes", ", ".join(schema.fork_keys())]),
        ("", ["seed=3"], ["seed: 0 -> 3", schema.SEED_FIXES_DATA]),
        ("", ["model.qk_gain=2"], ["model.qk_gain: 1.0 -> 2.0", schema.INIT_ONLY]),
        ("@10", ["train.steps=8"], ["train.steps: got 8", "step 10", ">= 10"]),
    ],
    ids=["no-checkpoint", "shape", "seed", "init-only", "short-budget"],
)
def test_a_fork_that_cannot_be_is_refused_in_one_line_before_anything_is_made(
    made, tmp_path, capsys, target, overrides, fragments
):
    _, short_run, _ = made
    code, err = call(capsys, "train", "--fork", f"{short_run}{target}", *overrides, f"runs_dir={tmp_path}")
    assert code == common.EXIT_BAD_INPUT and err.count("\n") == 1 and err.startswith("error: "), err
    for fragment in fragments:
        assert fragment.format(run=short_run) in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_fork_refuses_a_config_file_and_resume_together(made, capsys):
    _, short_run, _ = made
    for args, fragment in (
        (["--fork", short_run, "--resume", short_run], "--resume and --fork cannot be given"),
        (["cfg.yaml", "--fork", short_run], "give changes as key=value, not the config file"),
    ):
        code, err = call(capsys, "train", *args)
        assert code == common.EXIT_BAD_INPUT and fragment in err, err


def test_a_fork_is_written_before_its_config_so_a_failed_fork_leaves_nothing(made, tmp_path, monkeypatch, capsys):
    _, short_run, _ = made

    def full_disk(path, data):
        raise runs.RunError(f"{path}: cannot write: no space left on device (the file is left as it was)")

    monkeypatch.setattr(runs, "write_atomic", full_disk)
    code, err = call(capsys, "train", "--fork", short_run, f"runs_dir={tmp_path}")
    assert code == common.EXIT_BAD_INPUT and "no space left on device" in err, err
    assert list(tmp_path.iterdir()) == []
    assert yaml.safe_load((short_run / "config.yaml").read_text())["train"]["steps"] == SHORT


def test_an_empty_last_checkpoint_is_named_with_the_kept_ones_to_fork_from(short, capsys):
    """checkpoint.npz emptied (its link to the last kept one broken first): a
    resume and a fork of the last checkpoint each refuse it in one line that
    names the file and the steps still kept, and change nothing."""
    (short / "checkpoint.npz").unlink()
    (short / "checkpoint.npz").write_bytes(b"")
    before = {p.name: p.read_bytes() for p in short.iterdir() if p.is_file()}
    for args in (["--resume", short, f"train.steps={LONG}"], ["--fork", short]):
        code, err = call(capsys, "train", *args)
        assert code == common.EXIT_BAD_INPUT and len(err.strip().splitlines()) == 1, err
        assert "checkpoint.npz" in err and ", ".join(map(str, KEPT)) in err, err
    assert {p.name: p.read_bytes() for p in short.iterdir() if p.is_file()} == before
    code, _ = call(capsys, "train", "--fork", f"{short}@{SHORT}", "--name", "from-the-kept-one")
    assert code == common.EXIT_OK
