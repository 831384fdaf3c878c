"""Faults in distributed and concurrent sweeps (`make test-faults`; slower
than the rest: real processes, a real Dask cluster).

- A Dask scheduler and two workers, each its own process on 127.0.0.1 (as
  `dask scheduler` and `dask worker` run on a cluster): a worker SIGKILLed
  while it trains a cell past its first checkpoint. The sweep still
  finishes, every run completes exactly once, the killed worker's run is
  resumed from its checkpoint (by the other worker), and every run's metrics
  equal an uninterrupted sweep's.
- The Dask scheduler SIGKILLed mid-sweep (then its orphaned worker):
  `attn sweep --executor` says so in one line, no traceback, exit 1, every
  cell it had `unknown (the scheduler was lost)`, no report; the same
  command, against a new scheduler on the same address, finishes the rest
  (each run once, equal to an uninterrupted sweep) and writes the report.
- Two sweeps and `attn train --resume` started at once on one experiment,
  one of whose cells is interrupted: every cell runs once, whoever wins it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from helpers import without_timing

from attn.cli import common
from attn.experiment import spec as experiments
from attn.experiment import sweep
from attn.store import locks, runs
from attn.train import lifecycle

pytestmark = pytest.mark.faults
distributed = None  # dask.distributed, imported by the fixture below when a test here runs


@pytest.fixture(scope="module", autouse=True)
def distributed_installed():
    """Imported as a test of this module starts (make test-faults), not as make test's workers collect it
    (each would import it, ~0.5 CPU-s, for tests it deselects)."""
    global distributed
    distributed = pytest.importorskip("distributed")


REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}
STEPS, LOG_EVERY, CHECKPOINT_EVERY = 1500, 100, 100  # a run lasts about a second: long enough to be caught mid-run
OVERRIDES = {
    "model.d_model": 16,
    "model.d_k": 8,
    "task.eval_size": 64,
    "train.batch_size": 16,
    "train.steps": STEPS,
    "logging.log_every": LOG_EVERY,
    "logging.checkpoint_every": CHECKPOINT_EVERY,
    "logging.plots": False,
    "logging.attention_examples": 0,
}
TIMEOUT = 120  # seconds; only a hung cluster or sweep gets near it


def write_experiment(directory: Path, name: str, grid: dict, seeds: list) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "base": str(REPO / "configs" / "default.yaml"),
                "overrides": {k: v for k, v in OVERRIDES.items() if k not in grid},
                "grid": grid,
                "seeds": seeds,
            }
        )
    )
    return path


def wait_for(condition, what: str):
    deadline = time.monotonic() + TIMEOUT
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return result


def uninterrupted(experiment_file: Path, runs_dir: Path) -> experiments.Experiment:
    experiment = experiments.load_experiment(experiment_file, str(runs_dir))
    outcomes = sweep.run_experiment(experiment, ThreadPoolExecutor(2))
    assert {o.status for o in outcomes} == {"completed"}
    return experiment


def assert_ran_once_like(run_dir: Path, reference: Path) -> None:
    """Completed, each logged step recorded once, metrics equal to the reference run's."""
    assert runs.read_summary(run_dir)["status"] == "completed"
    records = runs.read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(0, STEPS + 1, LOG_EVERY))
    assert without_timing(records) == without_timing(runs.read_metrics(reference))


class Cluster:
    """`dask scheduler` and `dask worker`s as separate processes on 127.0.0.1
    (no nanny: a killed worker stays dead, as a lost machine does)."""

    def __init__(self, root: Path, n_workers: int, port: int = 0):
        self.root = root
        scheduler_file = root / f"scheduler-{time.monotonic_ns()}.json"
        self.scheduler = self._start(
            "scheduler", "--host", "127.0.0.1", "--port", port, "--no-dashboard", "--scheduler-file", scheduler_file
        )
        self.address = wait_for(
            lambda: scheduler_file.exists() and json.loads(scheduler_file.read_text() or "{}").get("address"),
            "the scheduler",
        )
        self.workers = [
            self._start(
                "worker",
                self.address,
                "--host",
                "127.0.0.1",
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
                "--name",
                f"worker-{i}",
            )
            for i in range(n_workers)
        ]
        with distributed.Client(self.address, timeout="30s") as client:
            client.wait_for_workers(n_workers, timeout=TIMEOUT)

    def _start(self, role: str, *args) -> subprocess.Popen:
        log = open(self.root / f"{role}-{time.monotonic_ns()}.log", "w")
        return subprocess.Popen(
            [sys.executable, "-m", "dask", role, *map(str, args)],
            cwd=self.root,
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        for process in [*self.workers, self.scheduler]:
            if process.poll() is None:
                process.terminate()
        for process in [*self.workers, self.scheduler]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def cluster(tmp_path):
    cluster = Cluster(tmp_path, n_workers=2)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_killed_dask_worker_s_runs_resume_from_their_checkpoints_and_finish_once(cluster, tmp_path):
    path = write_experiment(tmp_path, "lost", {"optim.lr": [0.2, 0.1]}, [0, 1])
    reference = uninterrupted(path, tmp_path / "reference")
    experiment = experiments.load_experiment(path, str(tmp_path / "runs"))
    executor = sweep.executor_from_address(f"dask://{cluster.address.removeprefix('tcp://')}")
    worker_pids = {worker.pid: worker for worker in cluster.workers}

    def a_worker_past_its_first_checkpoint():
        for cell in experiment.cells:
            run_dir = experiment.directory / cell.name
            try:
                summary = runs.read_summary(run_dir)
            except runs.RunError:
                continue  # being replaced as we read it is not possible (atomic), but be safe
            if (
                summary
                and summary["status"] == "running"
                and summary.get("pid") in worker_pids
                and (run_dir / "checkpoint.npz").exists()
                and locks.is_locked(run_dir)
            ):
                return cell.name, worker_pids[summary["pid"]]
        return None

    with executor:
        futures = ThreadPoolExecutor(1).submit(sweep.run_experiment, experiment, executor)
        killed_cell, worker = wait_for(a_worker_past_its_first_checkpoint, "a run past its first checkpoint")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        outcomes = {o.cell: o for o in futures.result(timeout=TIMEOUT)}
    assert sorted(outcomes) == sorted(c.name for c in experiment.cells)
    assert {o.status for o in outcomes.values()} == {"completed"}, outcomes
    assert outcomes[killed_cell].action == "resumed", outcomes[killed_cell]
    assert runs.read_summary(experiment.directory / killed_cell)["resumed_from"] >= CHECKPOINT_EVERY
    for cell in experiment.cells:
        assert_ran_once_like(experiment.directory / cell.name, reference.directory / cell.name)


def test_two_sweeps_and_a_cli_resume_at_once_run_each_cell_once(tmp_path):
    path = write_experiment(tmp_path, "race", {"optim.lr": [0.2, 0.1]}, [0])
    reference = uninterrupted(path, tmp_path / "reference")
    experiment = experiments.load_experiment(path, str(tmp_path / "runs"))
    contested = experiment.cells[0]
    run_dir = experiment.directory / contested.name
    run_dir.mkdir(parents=True)
    runs.write_config(run_dir, yaml.safe_load(yaml.safe_dump(lifecycle.to_dict(contested.config))), {})
    stop = lifecycle.StopFlag()
    lifecycle.execute(
        contested.config,
        run_dir,
        stop=stop,
        progress=lambda step, _: stop.request("SIGINT") if step == 2 * CHECKPOINT_EVERY else None,
    )
    assert runs.read_summary(run_dir)["status"] == "interrupted"

    def start(*args):
        return subprocess.Popen(
            [sys.executable, "-m", "attn", *map(str, args)],
            cwd=tmp_path,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    processes = [start("sweep", path, "--runs-dir", tmp_path / "runs", "--workers", "1") for _ in range(2)]
    processes.append(start("train", "--resume", run_dir))
    results = [(p.wait(timeout=TIMEOUT), p.stdout.read(), p.stderr.read()) for p in processes]
    for code, _, err in results:
        assert "Traceback" not in err, err
    (sweep_1, _, err_1), (sweep_2, _, err_2), (resume_code, _, resume_err) = results
    assert (sweep_1, sweep_2) == (common.EXIT_OK, common.EXIT_OK), (err_1, err_2)
    lines = [line for err in (err_1, err_2) for line in err.splitlines() if line.startswith("[")]
    ran_by_sweeps = [line for line in lines if f"] {contested.name}: resumed, completed" in line]
    if resume_code == common.EXIT_OK:
        assert ran_by_sweeps == [], "the CLI resumed it: no sweep may have run it too"
    else:
        assert resume_code == common.EXIT_BAD_INPUT and resume_err.count("\n") == 1, resume_err
        assert "in use by attn sweep (pid" in resume_err or "already completed" in resume_err, resume_err
        assert len(ran_by_sweeps) == 1, lines
    for cell in experiment.cells:
        assert_ran_once_like(experiment.directory / cell.name, reference.directory / cell.name)
    other = experiment.cells[1].name
    assert sum(f"] {other}: ran, completed" in line for line in lines) == 1, lines


def test_a_lost_dask_scheduler_is_one_line_and_the_same_command_finishes_the_rest(tmp_path):
    path = write_experiment(tmp_path, "orphaned", {"model.d_k": [8, 16], "optim.lr": [0.1]}, [0, 1])
    reference = uninterrupted(path, tmp_path / "reference")
    experiment = experiments.load_experiment(path, str(tmp_path / "runs"))
    cluster = Cluster(tmp_path, n_workers=1)
    address = f"dask://{cluster.address.removeprefix('tcp://')}"
    command = [
        sys.executable,
        "-m",
        "attn",
        "sweep",
        str(path),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--executor",
        address,
    ]
    try:
        sweeping = subprocess.Popen(
            command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        wait_for(lambda: any(experiment.directory.glob("*/checkpoint.npz")), "a run past its first checkpoint")
        cluster.scheduler.kill()
        cluster.scheduler.wait()
        _, err = sweeping.communicate(timeout=TIMEOUT)
        cluster.workers[0].kill()  # the orphaned worker, lost in turn
        cluster.workers[0].wait()
    finally:
        cluster.stop()
    assert sweeping.returncode == common.EXIT_FAILED, err
    assert "Traceback" not in err and "distributed" not in err, err
    lines = err.splitlines()
    assert lines[-1] == (
        f"error: the Dask scheduler at {address} was lost mid-sweep: what became of 4 of 4 runs is "
        f"unknown (a worker may still be training them), so no report is written; run the same "
        f"command again to finish the rest: attn {' '.join(command[3:])}"
    ), err
    ended = [line for line in lines if line.startswith("[")]
    assert len(ended) == 4 and all(line.endswith(": unknown (the scheduler was lost)") for line in ended), err
    assert lines[-2] == "sweep orphaned: 4 runs: 4 unknown (the scheduler was lost)", err
    assert not (experiment.directory / "report.json").exists(), "no report until every cell is accounted for"
    again = Cluster(tmp_path, n_workers=1, port=int(address.rsplit(":", 1)[1]))
    try:
        finished = subprocess.run(command, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    finally:
        again.stop()
    assert finished.returncode == common.EXIT_OK, finished.stderr
    assert "unknown" not in finished.stderr and (experiment.directory / "report.json").exists()
    for cell in experiment.cells:
        assert_ran_once_like(experiment.directory / cell.name, reference.directory / cell.name)
