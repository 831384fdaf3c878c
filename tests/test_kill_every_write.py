"""Exact resume at every kill point (the resume invariant in attn.train.loop's docstring).

A short run is SIGKILLed right after each of its durable writes in turn
(ATTN_TEST_KILL_AFTER_WRITES=N: write_atomic, append_metrics), then resumed
with `python -m attn train --resume`; every resumed run must equal an
uninterrupted one bit for bit: metrics.jsonl (less the timing fields), the
final checkpoint's arrays and metadata (less wall time), the attention
snapshots, the summary's figures and the checkpoints kept. The resume of one of them is killed at
each of its own writes too, and resumed again. A run killed before its first
checkpoint resumes from step 0 in place. `make test` kills at a sample of
the writes (the first, those around the first checkpoint, the last checkpoint
with its resume killed after its final summary, the last), `make test-slow`
a resume at a sample of its own writes, `make test-faults` at every one.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY, without_timing

from attn import cli
from attn.cli import common
from attn.config.loading import load_config
from attn.store import arrayfiles, runs, runstate
from attn.train import lifecycle, loop

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}
ENV.pop(runs.KILL_AFTER_WRITES, None)
# Adam (moments and a step count to restore), a checkpoint and a record every other step.
RUN = [
    *TINY,
    "train.steps=6",
    "logging.log_every=2",
    "logging.checkpoint_every=2",
    "optim.name=adam",
    "optim.lr=0.01",
    "logging.attention_examples=2",
    "logging.mechanism_step=2",
]


def start(root: Path, *args, kill_after: int | None = None) -> subprocess.Popen:
    """`python -m attn ARGS` in root; with kill_after, SIGKILLed after that many durable writes."""
    env = ENV if kill_after is None else {**ENV, runs.KILL_AFTER_WRITES: str(kill_after)}
    return subprocess.Popen(
        [sys.executable, "-m", "attn", *map(str, args)],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


def durable_writes(run_dir: Path, monkeypatch) -> list[str]:
    """The files an uninterrupted run writes durably, in order (counted in-process)."""
    written = []

    def counted(function, name_of):
        def wrapper(*args, **kwargs):
            function(*args, **kwargs)
            written.append(name_of(*args))

        return wrapper

    monkeypatch.setattr(runs, "write_atomic", counted(runs.write_atomic, lambda path, _: Path(path).name))
    monkeypatch.setattr(runs, "link_atomic", counted(runs.link_atomic, lambda _, path: Path(path).name))
    monkeypatch.setattr(runs, "append_metrics", counted(runs.append_metrics, lambda *_: "metrics.jsonl"))
    config = load_config(None, [*RUN, f"runs_dir={run_dir.parent}"])
    lifecycle.execute(config, lifecycle.create(config, name=run_dir.name))
    monkeypatch.undo()
    steps, log_every, checkpoint_every = config.train.steps, config.logging.log_every, config.logging.checkpoint_every
    assert written.count("metrics.jsonl") == steps // log_every + 1
    assert written.count("checkpoint.npz") == steps // checkpoint_every  # the last at step `steps`
    assert written[0] == "config.yaml" and written[-1] == "summary.json"
    return written


def checkpoint(run_dir: Path) -> tuple[dict, dict]:
    arrays = arrayfiles.load_arrays(run_dir / "checkpoint.npz")
    meta = json.loads(str(arrays.pop("meta")))
    meta.pop("wall_time")
    return arrays, meta


def assert_equals_uninterrupted(run_dir: Path, reference: Path) -> None:
    assert without_timing(runs.read_metrics(run_dir)) == without_timing(runs.read_metrics(reference))
    (ours, our_meta), (theirs, their_meta) = checkpoint(run_dir), checkpoint(reference)
    assert our_meta == their_meta and ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    for snapshot in ("attention.npz", "mechanism.npz", loop.MECHANISM_TRACE):
        ours, theirs = arrayfiles.load_arrays(run_dir / snapshot), arrayfiles.load_arrays(reference / snapshot)
        assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k], equal_nan=True) for k in ours)
    summary, expected = runs.read_summary(run_dir), runs.read_summary(reference)
    assert (summary["status"], summary["step"], summary["final"], summary["best"]) == (
        expected["status"],
        expected["step"],
        expected["final"],
        expected["best"],
    )
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert runstate.kept_checkpoint_steps(run_dir) == runstate.kept_checkpoint_steps(reference), "what it keeps"


def run_all(root: Path, commands: dict, kill_after: dict | None = None) -> dict:
    """Start every command at once (name -> argument list), then wait for all: name -> (exit code, stderr)."""
    started = {name: start(root, *args, kill_after=(kill_after or {}).get(name)) for name, args in commands.items()}
    return {name: finish(process) for name, process in started.items()}


def resume_until_complete(root: Path, run_dirs: list[Path]) -> None:
    """Resume each run (all at once); one killed after its final summary is already complete."""
    done = {
        run_dir: runs.read_summary(run_dir) and runs.read_summary(run_dir)["status"] == "completed"
        for run_dir in run_dirs
    }
    for run_dir, (code, stderr) in run_all(
        root, {run_dir: ["train", "--resume", run_dir] for run_dir in run_dirs}
    ).items():
        if done[run_dir]:
            assert code == common.EXIT_BAD_INPUT and "already completed" in stderr, stderr
        else:
            assert code == common.EXIT_OK, stderr


@pytest.fixture(scope="module")
def kill_points(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    reference = root / "reference" / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        written = durable_writes(reference, monkeypatch)
    return root, reference, written


def killed_runs_resume_exactly(kill_points, boundaries, tag: str) -> None:
    """A run killed right after write n, for each n of `boundaries`, resumes to the uninterrupted run (runs
    named by `tag`)."""
    root, reference, written = kill_points
    killed = run_all(
        root,
        {n: ["train", *RUN, "--name", f"{tag}-killed-{n}"] for n in boundaries},
        kill_after={n: n for n in boundaries},
    )
    assert {n: code for n, (code, _) in killed.items()} == {n: -signal.SIGKILL for n in boundaries}, killed
    run_dirs = [root / "runs" / f"{tag}-killed-{n}" for n in boundaries]
    resume_until_complete(root, run_dirs)
    for run_dir in run_dirs:
        assert_equals_uninterrupted(run_dir, reference)


def killed_resumes_resume_exactly(kill_points, boundaries, tag: str, first_kill: int | None = None) -> None:
    """The run is killed right after write `first_kill` (default: its first checkpoint); its resume is
    killed after write m, for each m of `boundaries`; a last resume finishes it."""
    root, reference, written = kill_points
    first_kill = first_kill or written.index("checkpoint.npz") + 1
    run_dirs = {m: root / "runs" / f"{tag}-twice-{m}" for m in boundaries}
    killed = run_all(
        root,
        {m: ["train", *RUN, "--name", run_dirs[m].name] for m in boundaries},
        kill_after=dict.fromkeys(boundaries, first_kill),
    )
    assert all(code == -signal.SIGKILL and (run_dirs[m] / "checkpoint.npz").exists() for m, (code, _) in killed.items())
    resumed = run_all(
        root, {m: ["train", "--resume", run_dirs[m]] for m in boundaries}, kill_after={m: m for m in boundaries}
    )
    assert all(code == -signal.SIGKILL for code, _ in resumed.values()), "each resume is killed where it was to be"
    resume_until_complete(root, list(run_dirs.values()))
    for run_dir in run_dirs.values():
        assert_equals_uninterrupted(run_dir, reference)


def resume_writes(written: list[str], after: int | None = None) -> int:
    """How many writes a resume makes of a run killed after write `after` (default: its first checkpoint): what
    is left, its own summary and truncation."""
    return len(written) - (after or written.index("checkpoint.npz") + 1) + 2


def last_checkpoint(written: list[str]) -> int:
    """The number of writes up to and including the last checkpoint's (its link as checkpoint.npz)."""
    return len(written) - written[::-1].index("checkpoint.npz")


def test_a_run_killed_after_a_sample_of_its_writes_resumes_to_the_uninterrupted_run(kill_points):
    """The first write, the first checkpoint and the writes on either side of it, the last (every one: make
    test-faults; the last checkpoint's, before the older ones are removed, is the next test's first kill)."""
    written = kill_points[2]
    checkpoint = written.index("checkpoint.npz") + 1
    boundaries = sorted({1, checkpoint - 1, checkpoint, checkpoint + 1, len(written)})
    killed_runs_resume_exactly(kill_points, boundaries, "sample")
    assert "mechanism.npz" in written and "attention.npz" in written


@pytest.mark.slow
def test_a_resume_killed_after_a_sample_of_its_writes_resumes_again_exactly(kill_points):
    killed_resumes_resume_exactly(kill_points, sorted({1, 2, resume_writes(kill_points[2])}), "sample")


def test_a_resume_killed_after_its_final_summary_has_kept_what_the_run_keeps(kill_points):
    """Killed after its last checkpoint, before the older ones were removed; its resume killed after its last
    write, the summary that says completed: nothing resumes a completed run, so what it keeps is final then."""
    after = last_checkpoint(kill_points[2])
    killed_resumes_resume_exactly(kill_points, [resume_writes(kill_points[2], after)], "final", after)


@pytest.mark.faults
def test_a_run_killed_after_any_write_resumes_to_the_uninterrupted_run(kill_points):
    killed_runs_resume_exactly(kill_points, range(1, len(kill_points[2]) + 1), "every")


@pytest.mark.faults
def test_a_resume_killed_after_any_of_its_writes_resumes_again_exactly(kill_points):
    killed_resumes_resume_exactly(kill_points, range(1, resume_writes(kill_points[2]) + 1), "every")
    after = last_checkpoint(kill_points[2])
    killed_resumes_resume_exactly(kill_points, range(1, resume_writes(kill_points[2], after) + 1), "every-last", after)


def test_a_fork_killed_before_its_config_is_written_is_named_as_cut_short(kill_points, capsys, monkeypatch):
    """A fork writes its checkpoint and records before its config.yaml; killed
    in between, its directory is no run, and every command says so in one line
    (the commands run in-process: a traceback would be an exception here)."""
    root, reference, _ = kill_points
    ((code, stderr),) = run_all(
        root, {0: ["train", "--fork", reference, "--name", "cut-short"]}, kill_after={0: 1}
    ).values()
    fork = reference.parent / "cut-short"  # beside its source: the fork keeps its runs_dir
    assert code == -signal.SIGKILL and list(fork.glob("checkpoint*.npz")) and not (fork / "config.yaml").exists(), (
        stderr
    )
    monkeypatch.chdir(root)
    for command in (["train", "--resume", fork], ["plot", fork], ["train", "--fork", fork]):
        code, stderr = cli.main([str(a) for a in command]), capsys.readouterr().err
        assert code == common.EXIT_BAD_INPUT and "Traceback" not in stderr, stderr
        assert "config.yaml" in stderr and "checkpoint-" in stderr and len(stderr.strip().splitlines()) == 1
