"""Whole-process measurements: a training run's peak memory, and sweeps.

- peak memory: ru_maxrss of `python -m attn train` for a short run at a
  size, measured in a fresh interpreter (Linux carries a process's peak RSS
  across fork and exec, so a child of the benchmark itself would report at
  least the benchmark's own peak);
- a sweep of the old headline grid (THROUGHPUT_GRID: 5 d_k x 2 scales x 5
  seeds of 500 steps) through the real runner (attn.experiment.sweep), with one
  worker and with one per core: its wall time, how much of the workers'
  time went to training (the sweep's efficiency: the stacks' training
  seconds over wall time x workers), and the speed-up of the second;
- the headline's work, counted: the multiply-adds of its runs' head steps
  (attn.train.stack.head_step_cost) against this machine's float32 matrix
  product rate (a large product at one thread), so the time any
  implementation of the same algorithm needs at least is known beside the
  time attn takes;
- optionally, the headline experiment itself (experiments/sqrt_dk.yaml, or
  the part of it some --only restrictions leave) swept as `attn sweep` sweeps it,
  report included, in a child process on every core: its wall time, the CPU
  seconds of the child and its workers, the cores they kept busy on average,
  and the sweep's timeline (attn.experiment.timeline); with another checkout's
  code, both swept in alternating rounds, so that load elsewhere hits both alike.
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from attn.bench.timing import BASE_CONFIG, REPO, SIZES
from attn.config.yamlio import dump_yaml

THROUGHPUT_GRID = {"model.d_k": [16, 64, 256, 1024, 4096], "model.scale": ["sqrt", "none"]}
THROUGHPUT_OVERRIDES = {
    "model.d_v": 32,
    "optim.lr": 0.3,
    "train.steps": 500,
    "task.eval_size": 256,
    "logging.log_every": 10,
    "logging.checkpoint_every": 250,
}
THROUGHPUT_SEEDS = [0, 1, 2, 3, 4]
HEADLINE = REPO / "experiments" / "sqrt_dk.yaml"

_PEAK_RSS_OF_CHILD = (
    "import resource, subprocess, sys; "
    "code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)"
)


def training_peak_memory(name: str, steps: int = 20) -> dict:
    """Peak RSS (ru_maxrss) of `python -m attn train` at size `name` for `steps` steps (no figures)."""
    with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
        command = [
            sys.executable,
            "-m",
            "attn",
            "train",
            str(BASE_CONFIG),
            *SIZES[name],
            f"train.steps={steps}",
            f"runs_dir={tmp}",
            "logging.plots=false",
        ]
        report = subprocess.run(
            [sys.executable, "-c", _PEAK_RSS_OF_CHILD, *command], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout
    max_rss_kib, exit_code = (int(field) for field in report.split())
    return {"size": name, "steps": steps, "peak_rss_mib": max_rss_kib / 1024, "exit_code": exit_code}


def timed_sweep(experiment_file: Path, workers: int, runs_dir: Path) -> dict:
    """Run an experiment into runs_dir with `workers` local workers: wall
    time, the runs' outcomes, the stacks' training seconds, and the efficiency."""
    from attn.experiment import sweep
    from attn.experiment.spec import load_experiment

    experiment = load_experiment(experiment_file, runs_dir=str(runs_dir))
    start = time.perf_counter()
    with sweep.default_executor(workers) as executor:
        outcomes = sweep.run_experiment(experiment, executor)
    wall = time.perf_counter() - start
    training = sum(o.train_seconds for o in outcomes)
    return {
        "workers": workers,
        "runs": len(outcomes),
        "stacks": len(sweep.split_tail(sweep.plan_stacks(experiment.cells), workers)),
        "completed": sum(o.status == "completed" for o in outcomes),
        "diverged": sum(o.status == "diverged" for o in outcomes),
        "wall_s": wall,
        "training_s": training,
        "efficiency": training / (wall * workers),
    }


def throughput_experiment(directory: Path) -> Path:
    """The old headline grid as an experiment file in `directory`."""
    path = directory / "throughput.yaml"
    path.write_text(
        dump_yaml(
            {
                "name": "throughput",
                "base": str(BASE_CONFIG),
                "overrides": THROUGHPUT_OVERRIDES,
                "grid": THROUGHPUT_GRID,
                "seeds": THROUGHPUT_SEEDS,
            }
        )
    )
    return path


def sweep_scaling(progress) -> dict:
    """timed_sweep of the old headline grid with 1 worker and with one per core."""
    cores = os.cpu_count() or 1
    results = []
    with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
        path = throughput_experiment(Path(tmp))
        for workers in sorted({1, cores}):
            progress(f"sweep of the old headline grid (50 runs) with {workers} worker(s)")
            results.append(timed_sweep(path, workers, Path(tmp) / f"runs-{workers}"))
    speedup = results[0]["wall_s"] / results[-1]["wall_s"] if len(results) > 1 else None
    return {
        "grid": THROUGHPUT_GRID,
        "overrides": THROUGHPUT_OVERRIDES,
        "seeds": THROUGHPUT_SEEDS,
        "results": results,
        "speedup": speedup,
    }


PEAK_PRODUCT_SIZE = 1024  # n of the n x n float32 product whose rate stands for the machine's peak


def matmul_rate(repeats: int = 7) -> float:
    """Multiply-adds per second of an n x n float32 matrix product at one BLAS
    thread (n = PEAK_PRODUCT_SIZE), the best of `repeats`: near the core's peak,
    which the head's small products do not reach."""
    from threadpoolctl import threadpool_limits

    n = PEAK_PRODUCT_SIZE
    a, b = np.random.default_rng(0).standard_normal((2, n, n), dtype=np.float32)
    out = np.empty_like(a)
    with threadpool_limits(limits=1):
        np.matmul(a, b, out=out)  # warm-up
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            np.matmul(a, b, out=out)
            best = min(best, time.perf_counter() - start)
    return n**3 / best


def headline_work(progress, only: tuple[str, ...] = ()) -> dict:
    """The headline's head multiply-adds over every run's training steps (the
    runs its `only` restrictions leave), and the least wall time they take on
    every core at matmul_rate (evaluation, embeddings, softmax and the
    optimiser come on top)."""
    from attn.experiment.spec import load_experiment
    from attn.train.stack import head_step_cost

    progress("the headline's work, counted, and this machine's matrix-product rate")
    experiment = load_experiment(HEADLINE, runs_dir=tempfile.gettempdir(), only=only)
    multiply_adds = sum(cell.config.train.steps * head_step_cost(cell.config) for cell in experiment.cells)
    rate, cores = matmul_rate(), os.cpu_count() or 1
    return {
        "experiment": str(HEADLINE.relative_to(REPO)),
        "only": list(only),
        "runs": len(experiment.cells),
        "head_multiply_adds": multiply_adds,
        "matmul_rate_per_core": rate,
        "cores": cores,
        "least_seconds": multiply_adds / (rate * cores),
    }


THIS_CODE = "this checkout"


def headline_sweep(
    runs_dir: Path,
    workers: int,
    only: tuple[str, ...] = (),
    code: Path | None = None,
    experiment: Path = HEADLINE,
    env: dict | None = None,
) -> dict:
    """`attn sweep experiments/sqrt_dk.yaml --workers N [--only ...]` into runs_dir, in a
    child process running `code`'s checkout (default: this one; `experiment`: another
    file of this checkout): its wall time, the CPU seconds of the child and every
    process it waited for (its workers), cores busy on average, its exit code, and
    its timeline's records and summary (None for code that writes no timeline). `env`: more environment
    for the child (attn.bench.devices.sweep_environment: devices switched off in its every process)."""
    from attn.config.yamlio import read_yaml_file
    from attn.experiment import timeline

    root = Path(code).resolve() if code is not None else REPO
    experiment = root / Path(experiment).resolve().relative_to(REPO) if code is not None else Path(experiment)
    command = [sys.executable, "-m", "attn", "sweep", str(experiment)]
    command += ["--runs-dir", str(runs_dir), "--workers", str(workers)]
    command += [argument for text in only for argument in ("--only", text)]
    env = {**os.environ, "PYTHONPATH": str(root), "CI": "true", **(env or {})}
    before = timeline.cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    cpu = timeline.cpu_seconds(resource.RUSAGE_CHILDREN) - before
    path = Path(runs_dir) / read_yaml_file(experiment, "experiment file")["name"] / timeline.TIMELINE_FILE
    records = timeline.read_timeline(path) if path.exists() else []
    return {
        "code": THIS_CODE if code is None else str(code),
        "exit_code": done.returncode,
        "error": None if done.returncode == 0 else done.stderr.strip().splitlines()[-1:],
        "wall_s": wall,
        "cpu_s": cpu,
        "cores_busy": cpu / wall,
        "timeline": timeline.summarise(records) if records else None,
        "timeline_records": records,
    }


def headline_wall_time(
    progress, only: tuple[str, ...] = (), other_codes: tuple[Path, ...] = (), rounds: int = 1
) -> dict:
    """headline_sweep of experiments/sqrt_dk.yaml (its `only` cells) on every core, into a
    temporary directory, `rounds` times; with other_codes, those checkouts' sweeps too, every
    code once a round, the order turned by one each round (this, A, B; then A, B, this; ...) so
    that each code takes each place in turn. Each measurement, and the median wall time, CPU
    seconds and cores busy of this checkout's."""
    from attn.experiment.spec import load_experiment

    cores = os.cpu_count() or 1
    runs = len(load_experiment(HEADLINE, runs_dir=tempfile.gettempdir(), only=only).cells)
    measured = []
    for round_ in range(rounds):
        codes = [None, *other_codes]
        codes = codes[round_ % len(codes) :] + codes[: round_ % len(codes)]
        for code in codes:
            progress(
                f"the headline experiment ({HEADLINE.name}{''.join(' --only ' + o for o in only)}: {runs} runs) "
                f"with {cores} worker(s), {THIS_CODE if code is None else code}, round {round_ + 1} of {rounds}"
            )
            with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
                measured.append({"round": round_ + 1, **headline_sweep(Path(tmp), cores, only, code)})
            if code is None and measured[-1]["exit_code"] != 0:  # its wall time is not the headline's
                error = " | ".join(measured[-1]["error"] or []) or "no message"
                raise RuntimeError(
                    f"the headline sweep of {THIS_CODE} failed (round {round_ + 1}, exit "
                    f"{measured[-1]['exit_code']}): {error}"
                )
    mine = [m for m in measured if m["code"] == THIS_CODE]
    timelines = [m["timeline"] for m in mine if m["timeline"]]
    return {
        "experiment": str(HEADLINE.relative_to(REPO)),
        "only": list(only),
        "runs": runs,
        "workers": cores,
        "stacks": timelines[0]["stacks"] if timelines else None,
        "wall_s": _median([m["wall_s"] for m in mine]),
        "cpu_s": _median([m["cpu_s"] for m in mine]),
        "cores_busy": _median([m["cores_busy"] for m in mine]),
        "efficiency": _median([t["efficiency"] for t in timelines]) if timelines else None,
        "measured": measured,
    }


def _median(values: list[float]) -> float:
    return float(np.median(values))
