"""Sweeps through the real CLI, in subprocesses, with real signals: Ctrl-C
to the whole process group and SIGTERM to the sweep alone stop it with every
started run checkpointed and the rest not started, and re-running the command
resumes them to the same metrics as an uninterrupted sweep (make test-slow:
Ctrl-C mid-run; make test-faults: each way in turn); two sweeps over
one experiment started at once run every cell exactly once; a failing run is
reported when it fails; on a non-terminal the progress is one plain line per
run (these in make test-slow). Bad experiment files are refused in one line
(in-process, make test)."""

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import without_timing

from attn import cli
from attn.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_SIGNAL
from attn.store import runs

ROOT = Path(__file__).resolve().parent.parent
STEPS, LOG_EVERY = 500, 50  # long enough that a signal sent as a run starts lands mid-run
TINY = {
    "model.d_model": 16,
    "task.eval_size": 64,
    "train.batch_size": 32,
    "train.steps": STEPS,
    "logging.log_every": LOG_EVERY,
    "logging.checkpoint_every": 250,
    "logging.plots": False,
    "logging.attention_examples": 0,
}
# Two keys: the report's x and arm; a rate at which every cell trains stably in float32. Three widths make
# three stacks (runs of one shape train as one), more than the two workers: a stack may wait its turn.
GRID = {"model.d_k": [8, 12, 16], "optim.lr": [0.2]}
SEEDS = [0, 1]
N_RUNS = len(GRID["model.d_k"]) * len(GRID["optim.lr"]) * len(SEEDS)
OUTCOME_LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+): (\S+), (.+?)  (.*)$")
TIMEOUT = 120  # seconds; only a hung sweep gets near it
_sweep_numbers = itertools.count()


def write_experiment(directory: Path, name: str, seeds=SEEDS, **overrides) -> Path:
    data = {
        "name": name,
        "base": str(ROOT / "configs" / "default.yaml"),
        "overrides": {**TINY, **overrides},
        "grid": GRID,
        "seeds": seeds,
        "report": {"x": "model.d_k", "arm": "optim.lr"},
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Sweep:
    """`python -m attn sweep` in its own session (as a terminal's process
    group), CI=true, its output going to files that can be read while it runs;
    options: more of the command line (--no-report)."""

    def __init__(self, experiment: Path, runs_dir: Path, *options: str):
        self.experiment_dir = runs_dir / experiment.stem
        self.since = time.time()
        number = next(_sweep_numbers)
        self.out, self.err = (runs_dir.parent / f"sweep-{number}.{what}" for what in ("out", "err"))
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "attn",
                    "sweep",
                    str(experiment),
                    "--runs-dir",
                    str(runs_dir),
                    "--workers",
                    "2",
                    *options,
                ],
                cwd=ROOT,
                env={**os.environ, "CI": "true", "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def wait_until(self, condition) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not condition():
            assert self.process.poll() is None, self.err.read_text()
            assert time.monotonic() < deadline, "the sweep never got there"
            time.sleep(0.02)

    def started_a_run(self) -> bool:
        """A run of this sweep is training (its summary says so)."""
        return any(
            s["status"] == "running" and s["started_at"] > self.since
            for s in map(json.loads, map(Path.read_text, self.experiment_dir.glob("*/summary.json")))
        )

    def printed_its_header(self) -> bool:
        """Its signal handlers are in place; its workers may not exist yet."""
        return self.err.exists() and self.err.read_text().startswith("sweep ")

    def finish(self) -> tuple[int, str, str]:
        code = self.process.wait(timeout=TIMEOUT)
        out, err = self.out.read_text(), self.err.read_text()
        assert "Traceback" not in err, err
        return code, out, err


def outcomes(stderr: str) -> dict[str, tuple[str, str, str]]:
    """cell -> (action, status, detail) from the sweep's per-run lines, which
    must be plain (no carriage returns: no progress bar on a non-terminal)
    and one per run."""
    assert "\r" not in stderr
    found = [m for m in map(OUTCOME_LINE.match, stderr.splitlines()) if m]
    assert [int(m[1]) for m in found] == list(range(1, len(found) + 1)), stderr
    assert all(int(m[2]) == N_RUNS for m in found)
    result = {m[3]: (m[4], m[5], m[6]) for m in found}
    assert len(result) == len(found) == N_RUNS, stderr
    return result


def interrupt(experiment: Path, runs_dir: Path, when, send) -> tuple[int, dict]:
    """Start a sweep; once when(sweep) holds, deliver a signal with
    send(pid); the exit code and the per-run lines."""
    sweep = Sweep(experiment, runs_dir)
    sweep.wait_until(lambda: when(sweep))
    send(sweep.process.pid)
    code, out, err = sweep.finish()
    assert "re-run the same command to resume" in err, err
    assert out.strip() == str(sweep.experiment_dir)
    return code, outcomes(err)


def assert_completed_once(run_dir: Path) -> None:
    """Completed, and every logged step recorded exactly once, in order."""
    assert runs.read_summary(run_dir)["status"] == "completed"
    assert [r["step"] for r in runs.read_metrics(run_dir)] == list(range(0, STEPS + 1, LOG_EVERY))
    assert runs.read_config_dict(run_dir)["seed"] in SEEDS


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Two sweeps over one experiment started at the same moment (also the
    uninterrupted reference for the resume test)."""
    tmp = tmp_path_factory.mktemp("concurrent")
    experiment = write_experiment(tmp, "sig")
    both = [Sweep(experiment, tmp / "runs"), Sweep(experiment, tmp / "runs")]
    return experiment, both[0].experiment_dir, [sweep.finish() for sweep in both]


@pytest.mark.slow
def test_two_sweeps_at_once_run_every_cell_exactly_once(reference):
    _, experiment_dir, results = reference
    assert [code for code, _, _ in results] == [EXIT_OK, EXIT_OK], [err for _, _, err in results]
    seen = [outcomes(err) for _, _, err in results]
    for cell in seen[0]:
        actions = sorted(s[cell][0] for s in seen)
        assert actions[0] == "ran" and actions[1] in ("skipped-finished", "skipped-locked"), (cell, seen)
        assert_completed_once(experiment_dir / cell)
        for action, status, detail in (s[cell] for s in seen):
            if action == "skipped-locked":
                assert status == "running" and "another sweep" in detail and re.search(r"pid \d+ on \S+", detail)
            else:
                assert status == "completed"
    for (code, out, err), lines in zip(results, seen):
        assert out.strip() == str(experiment_dir)
        assert not any(line.startswith(("failed", "error")) for line in err.splitlines()), err
        locked = sum(action == "skipped-locked" for action, _, _ in lines.values())
        assert (f"{locked} running in another sweep" in err) == (locked > 0), err
    assert sorted(p.name for p in experiment_dir.iterdir() if p.is_dir()) == sorted(seen[0])
    assert f"{N_RUNS} finished runs of {N_RUNS} from" in (experiment_dir / "report.md").read_text(), (
        "the last one reported all"
    )


def ctrl_c(pid: int) -> None:
    os.killpg(pid, signal.SIGINT)  # to the process group, as a terminal's Ctrl-C: the sweep and its workers


def sigterm(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)  # to the sweep alone


def interrupted_then_resumed(reference, tmp_path, interruptions) -> None:
    """Each of `interruptions` (signal, when(sweep) holds, send(pid)) stops a sweep of the reference's
    experiment in turn; then the same command runs it to the end, to the uninterrupted metrics."""
    experiment, reference_dir, _ = reference
    runs_dir = tmp_path / "runs"
    experiment_dir = runs_dir / experiment.stem
    checkpointed = set()
    for signum, when, send in interruptions:
        code, seen = interrupt(experiment, runs_dir, when, send)
        assert code == EXIT_SIGNAL[signum.name]
        assert {action for action, _, _ in seen.values()} <= {"ran", "resumed", "cancelled"}
        started = {cell for cell, (action, _, _) in seen.items() if action != "cancelled"}
        assert len(started) < N_RUNS and (started or when is Sweep.printed_its_header), seen
        for cell, (action, status, detail) in seen.items():
            run_dir = experiment_dir / cell
            if cell in started:
                assert status == "interrupted" and f"stopped by {signum.name}" in detail
                assert (run_dir / "checkpoint.npz").exists()
                checkpointed.add(cell)
            else:
                assert status == "not started" and "stopped" in detail
                assert run_dir.exists() == (cell in checkpointed)
            if run_dir.exists():
                assert runs.read_summary(run_dir)["status"] == "interrupted"
    code, out, err = Sweep(experiment, runs_dir, "--no-report").finish()
    assert code == EXIT_OK, err
    for cell, (action, status, _) in outcomes(err).items():
        assert (action, status) == ("resumed" if cell in checkpointed else "ran", "completed")
        assert_completed_once(experiment_dir / cell)
        assert without_timing(runs.read_metrics(experiment_dir / cell)) == without_timing(
            runs.read_metrics(reference_dir / cell)
        )
        resumed, uninterrupted = runs.read_summary(experiment_dir / cell), runs.read_summary(reference_dir / cell)
        assert (resumed["final"], resumed["best"]) == (uninterrupted["final"], uninterrupted["best"])


@pytest.mark.slow
def test_an_interrupted_sweep_checkpoints_and_resumes_to_the_uninterrupted_metrics(reference, tmp_path):
    """Ctrl-C (to the process group) mid-run: the runs started are checkpointed, the third stack (two
    workers) is not started; then the same command to the end. Every way of stopping it, one after another:
    make test-faults (the next test)."""
    interrupted_then_resumed(reference, tmp_path, [(signal.SIGINT, Sweep.started_a_run, ctrl_c)])


@pytest.mark.faults
def test_interrupted_sweeps_checkpoint_and_resume_to_the_uninterrupted_metrics(reference, tmp_path):
    """Ctrl-C (to the process group) as the sweep starts, Ctrl-C mid-run,
    SIGTERM to the sweep alone mid-run, then the same command to the end."""
    interrupted_then_resumed(
        reference,
        tmp_path,
        [
            (signal.SIGINT, Sweep.printed_its_header, ctrl_c),
            (signal.SIGINT, Sweep.started_a_run, ctrl_c),
            (signal.SIGTERM, Sweep.started_a_run, sigterm),
        ],
    )


@pytest.mark.slow
def test_a_failing_run_is_reported_when_it_fails_and_the_others_complete(tmp_path):
    experiment = write_experiment(tmp_path, "fail", seeds=[0], **{"train.steps": STEPS // 2})
    blocked, others = (
        "d_k-16_lr-0.2_seed-0",
        {"d_k-8_lr-0.2_seed-0", "d_k-12_lr-0.2_seed-0"},
    )  # the costliest: first to start
    (tmp_path / "runs" / "fail").mkdir(parents=True)
    (tmp_path / "runs" / "fail" / blocked).write_text("a file where the run directory goes")
    code, out, err = Sweep(experiment, tmp_path / "runs", "--no-report").finish()
    lines = err.splitlines()
    assert code == EXIT_FAILED
    progress = [m for m in map(OUTCOME_LINE.match, lines) if m]
    assert (progress[0][3], progress[0][4], progress[0][5]) == (blocked, "failed", "failed"), (
        err
    )  # its stack fails at once
    assert {(m[3], m[4], m[5]) for m in progress[1:]} == {(other, "ran", "completed") for other in others}, err
    assert "FileExistsError" in progress[0][6]
    assert any(line.startswith(f"failed: {blocked}: ") for line in lines), err
    assert "\r" not in err


BAD_EXPERIMENTS = {  # name -> (what replaces the good file's keys, or the whole file; what the error says)
    "empty_grid": ({"grid": {}}, "grid: expected a non-empty mapping"),
    "unknown_key": (
        {"grid": {"model.dk": [4]}},
        "grid: `model.dk`: not a config field that a grid can vary; did you mean `model.d_k`?",
    ),
    "bad_cell": ({"grid": {"optim.lr": [0.1, -1.0]}}, "grid cell {optim.lr: -1.0}: optim.lr: got -1.0"),
    "no_base": ({"base": "nowhere.yaml"}, "base: TMP/nowhere.yaml: no such config file"),
    "not_a_mapping": (["a", "list"], "must be a YAML mapping"),
}


def test_bad_experiment_files_are_refused_in_one_line(tmp_path, capfd):
    """Each: exit 2, one `error:` line naming the experiment file and what is
    wrong, no traceback (in-process: it would be an exception), nothing created."""
    for name, (change, message) in BAD_EXPERIMENTS.items():
        path = write_experiment(tmp_path, name)
        if isinstance(change, dict):
            path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **change}))
        else:
            path.write_text(yaml.safe_dump(change))
        code = cli.main(["sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--workers", "2"])
        out, err = capfd.readouterr()
        assert (code, out) == (EXIT_BAD_INPUT, ""), (name, err)
        assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, (name, err)
        assert message.replace("TMP", str(tmp_path)) in err, (name, err)
    assert not (tmp_path / "runs").exists()
