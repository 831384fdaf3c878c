"""The training step of attn against its strongest rivals, timed side by side.

At each size of SIZES, in one process with a fixed number of threads:

- attn's step (forward, backward, SGD update; batches drawn beforehand) and
  every rival of attn.bench.rivals that is installed: PyTorch eager,
  torch.compile and JAX jit, each in the projected and the bilinear
  formulation, from the same weights on the same batches;
- numpy's float32 product of two MATMUL_N squares, the machine's rate in
  the same rounds (a yardstick that moves with the load).

Beside them, each timed side by side: attn's step at d_k 2^20 against d_k 64
(width_ratio), its forward and backward with X formed against its products
taken through the embedding tables (lookup_ratio), and, at one thread, with
subnormal gradients kept against flushed (subnormal_ratio).

Every side is warmed up (compiled) first; then the sides and the square
product alternate in ROUNDS rounds, so a burst of load elsewhere hits all
alike. The figure of merit is attn's median step over the fastest rival's:
the yardstick is the strongest rival, never the easiest. Each side's loss
after its steps is kept, to show they computed the same thing.

A child process per thread count (`python -m attn.bench.timing`) does the
timing, since JAX fixes its threads when it starts: OPENBLAS/OMP/MKL
threads and torch.set_num_threads set to N, and XLA limited to one thread
in the one-thread child (XLA has no flag for N threads; with N > 1 it uses
the cores it sees, which on a machine of N cores is N).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from attn.bench import calls, rivals
from attn.config.loading import load_config
from attn.config.schema import Config
from attn.model import fast, head, pairs
from attn.model.fast import Batch, ModelSpec
from attn.store import runstate
from attn.train import allocator, denormals

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "configs" / "default.yaml"
# name -> overrides of configs/default.yaml. `wide` is the headline
# experiment's costliest cell (d_k 4096 at d_model 64); `large` is retrieval
# with 63 pairs (T = 64), its rate lowered so that every timed step stays
# finite: the cost of a step does not depend on the rate.
SIZES = {
    "default": (),
    "wide": ("model.d_k=4096", "model.d_v=32"),
    "copy": ("task.name=copy", "task.length=16", "model.d_k=64"),
    "large": (
        "task.name=retrieval",
        "task.n_keys=64",
        "task.n_pairs=63",
        "train.batch_size=128",
        "model.d_model=256",
        "model.d_k=256",
        "optim.lr=0.1",
    ),
}
MATMUL_N = 2048
BATCH_POOL = 16  # distinct batches cycled through by the timed steps
ROUNDS = 5  # alternating rounds of every side and one square product
THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
PROGRESS_PREFIX = "bench-child: "


def size_config(name: str) -> Config:
    """configs/default.yaml with the overrides of size `name`."""
    return load_config(BASE_CONFIG, SIZES[name])


def batch_pool(task, gens, config: Config) -> list[Batch]:
    """The BATCH_POOL batches a timed side cycles through, drawn from the run's data generator."""
    return [task.sample(gens.data, config.train.batch_size) for _ in range(BATCH_POOL)]


def query_positions(spec: ModelSpec, batches: list[Batch]) -> int:
    """How many positions carry a target in some batch of the pool: the head's queries."""
    return int(np.arange(spec.n_positions)[rivals.pooled_target_positions(batches)].size)


def step_flops(spec: ModelSpec, batch_size: int, positions: int) -> int:
    """Matrix-multiply FLOPs of attn's step with its query side at
    `positions` of the T positions: twice the multiply-adds of the head's
    association (attn.model.head.head_costs) and the readout's three products.
    The embeddings' one-hot products are not counted."""
    B, T, D, C = batch_size, spec.n_positions, spec.d_model, spec.n_classes
    head_cost = min(
        head.head_costs(
            B,
            positions,
            T,
            D,
            spec.k_width,
            spec.v_width,  # as carried
            normed=spec.normed,
        ).values()
    )
    return 2 * head_cost + 3 * 2 * B * positions * D * C


def spread(seconds: list[float]) -> dict:
    """Median, quartiles and extremes, in milliseconds."""
    ms = np.asarray(seconds) * 1e3
    p25, median, p75 = np.percentile(ms, [25, 50, 75])
    return {
        "median_ms": float(median),
        "p25_ms": float(p25),
        "p75_ms": float(p75),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "n": int(ms.size),
    }


def time_interleaved(
    work: dict[str, tuple[Callable, int]], rounds: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """name -> the seconds of each call by `clock`, where work[name] = (function, calls
    per round). All are timed in `rounds` alternating rounds, so that load
    elsewhere on the machine hits each alike; the garbage collector is off
    meanwhile."""
    times = {name: [] for name in work}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, (function, calls) in work.items():
                for _ in range(calls):
                    start = clock()
                    function()
                    times[name].append(clock() - start)
    finally:
        gc.enable()
    return times


def timed_side_by_side(steppers: dict, warmup: int, steps: int, what: str, progress: Callable[[str], None]) -> dict:
    """name -> spread of each side's call times: `warmup` untimed calls each,
    then every side in ROUNDS alternating rounds (time_interleaved)."""
    for side in steppers.values():
        for _ in range(warmup):
            side()
    progress(f"{what}: timing {' and '.join(map(str, steppers))} in {ROUNDS} rounds")
    times = time_interleaved({name: (side, math.ceil(steps / ROUNDS)) for name, side in steppers.items()}, ROUNDS)
    return {name: spread(times[name]) for name in steppers}


def square_product(n: int = MATMUL_N) -> Callable[[], None]:
    """One float32 n x n @ n x n product (2 n^3 FLOPs) into a fixed buffer."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    return lambda: np.matmul(a, b, out=out)


def attn_stepper(config: Config, spec: ModelSpec, params: dict, optimizer, batches: list[Batch]) -> Callable:
    """step() -> loss: one training step of attn on the next batch of the pool."""
    pool = itertools.cycle(batches)

    def step():
        loss, grads, _ = fast.loss_and_grads(params, spec, next(pool))
        optimizer.step(params, grads, config.optim.lr)
        return float(loss)

    return step


def attn_calls(config: Config, steps: int = 3) -> dict:
    """attn's calls per training step at `config` (attn.bench.calls), on a fresh
    run of its own after one step (which fills the caches): numpy calls, and
    function calls of any kind. Counts, not times: the same on every machine."""
    task, spec, params, optimizer, gens = runstate.build(config)
    batches = batch_pool(task, gens, config)
    step = attn_stepper(config, spec, params, optimizer, batches)
    step()
    functions = calls.function_calls(step, steps)
    optimizer.state = {key: calls.counted(value) for key, value in optimizer.state.items()}
    counted = attn_stepper(
        config,
        spec,
        {name: calls.counted(p) for name, p in params.items()},
        optimizer,
        [Batch(*(calls.counted(getattr(b, f.name)) for f in dataclasses.fields(b))) for b in batches],
    )
    return {"numpy": sum(calls.numpy_calls(counted, steps).values()) / steps, "functions": functions / steps}


def bench_size(
    name: str, warmup: int, steps: int, progress: Callable[[str], None], frameworks=rivals.FRAMEWORKS
) -> dict:
    """Time attn and every installed rival of `frameworks` at one size (module docstring)."""
    config = size_config(name)
    task, spec, params, optimizer, gens = runstate.build(config)
    batches = batch_pool(task, gens, config)
    steppers, skipped = {}, {}
    # The rivals run the textbook algorithm on the d_k-wide weights, also when attn carries them width-free.
    rival_spec, rival_params = spec, params
    if spec.width_free:
        rival_spec = dataclasses.replace(spec, width_free=False)
        rival_params = fast.materialize_params(params, spec, runstate.make_generators(config.seed).init)
    for framework, formulation in itertools.product(frameworks, rivals.FORMULATIONS):
        if not rivals.available(framework):
            skipped[framework] = "not installed"
            continue
        progress(f"{name}: preparing {framework} {formulation}")
        steppers[f"{framework} {formulation}"] = rivals.stepper(
            framework, formulation, rival_spec, rival_params, batches, config.optim.lr
        )
    steppers["attn"] = attn_stepper(config, spec, {k: v.copy() for k, v in params.items()}, optimizer, batches)
    for side, step in steppers.items():
        for _ in range(warmup):
            step()
    per_round = math.ceil(steps / ROUNDS)
    work = {side: (step, per_round) for side, step in steppers.items()}
    work["matmul"] = (square_product(), 1)
    progress(f"{name}: timing {len(steppers)} sides in {ROUNDS} rounds")
    times = time_interleaved(work, ROUNDS)
    matmul_seconds = times.pop("matmul")
    positions = query_positions(spec, batches)
    flops = step_flops(spec, config.train.batch_size, positions)
    sides = {side: {**spread(seconds), "loss_after": steppers[side]()} for side, seconds in times.items()}
    fastest = min((s for s in sides if s != "attn"), key=lambda s: sides[s]["median_ms"], default=None)
    return {
        "size": name,
        "overrides": list(SIZES[name]),
        "shape": {
            "task": config.task.name,
            "B": config.train.batch_size,
            "T": spec.n_positions,
            "P": positions,
            "d_model": spec.d_model,
            "d_k": spec.d_k,
            "d_v": spec.d_v,
            "classes": spec.n_classes,
        },
        "association": head.choose_association(
            config.train.batch_size,
            positions,
            spec.n_positions,
            spec.d_model,
            spec.d_k,
            spec.d_v,
            spec.width_free,
            spec.normed,
        ),
        "attn_gflop_per_step": flops / 1e9,
        "matmul_gflops": 2.0 * MATMUL_N**3 / float(np.median(matmul_seconds)) / 1e9,
        "sides": sides,
        "skipped": skipped,
        "fastest_rival": fastest,
        "attn_calls": attn_calls(config),
        "ratio_to_fastest": sides["attn"]["median_ms"] / sides[fastest]["median_ms"] if fastest else None,
    }


WIDTHS = (64, 1 << 20)  # d_k of the width comparison, at configs/default.yaml's d_model (64) and d_v = d_k
# ... at a rate low enough that d_k 2^20 stays finite (at 0.5 it diverges): the cost of a step does not depend on it
WIDTH_OVERRIDES = ("optim.lr=1e-4",)


def width_ratio(warmup: int, steps: int, progress: Callable[[str], None]) -> dict:
    """attn's step at d_k = WIDTHS[-1] over its step at d_k = WIDTHS[0] (same
    d_model; the wide one width-free, attn.model.widthfree), timed side by
    side in alternating rounds."""
    steppers, width_free = {}, {}
    for d_k in WIDTHS:
        config = load_config(BASE_CONFIG, [f"model.d_k={d_k}", *WIDTH_OVERRIDES])
        task, spec, params, optimizer, gens = runstate.build(config)
        batches = batch_pool(task, gens, config)
        steppers[f"d_k {d_k}"] = attn_stepper(config, spec, params, optimizer, batches)
        width_free[str(d_k)] = spec.width_free
    timed = timed_side_by_side(steppers, warmup, steps, "width", progress)
    sides = {d_k: {**timed[f"d_k {d_k}"], "width_free": free} for d_k, free in width_free.items()}
    return {"sides": sides, "ratio": sides[str(WIDTHS[-1])]["median_ms"] / sides[str(WIDTHS[0])]["median_ms"]}


# The subnormal comparison: the `wide` size's materialized head with W_out scaled by SUBNORMAL_SCALE, so that
# every gradient behind the output layer is as small as a saturated run's W_q, W_k gradient (W_q's peaks near
# 1e-35, as in long_budget's unscaled runs at d_k 4096 by their end). Forward and backward only: an update
# would move W_out out of that range.
SUBNORMAL_OVERRIDES = ("model.d_k=4096", "model.d_v=32", "model.scale=none", "model.width_free=false")
SUBNORMAL_SCALE = 1e-34


def subnormal_state() -> tuple[ModelSpec, dict, list[Batch]]:
    """The subnormal comparison's model, weights and batches (above)."""
    config = load_config(BASE_CONFIG, list(SUBNORMAL_OVERRIDES))
    task, spec, params, _, gens = runstate.build(config)
    params["W_out"] *= params["W_out"].dtype.type(SUBNORMAL_SCALE)
    return spec, params, batch_pool(task, gens, config)


def subnormal_ratio(warmup: int, steps: int, progress: Callable[[str], None]) -> dict:
    """attn's forward and backward with subnormal gradients, subnormals kept
    over flushed to zero (attn.train.denormals, as training runs), timed
    side by side."""
    spec, params, batches = subnormal_state()
    pool = itertools.cycle(batches)

    def step(flush: bool):
        with denormals.flushing(flush):
            fast.loss_and_grads(params, spec, next(pool))

    sides = timed_side_by_side(
        {"kept": lambda: step(False), "flushed": lambda: step(True)}, warmup, steps, "subnormals", progress
    )
    return {"sides": sides, "ratio": sides["kept"]["median_ms"] / sides["flushed"]["median_ms"]}


def lookup_ratio(sizes: list[str], warmup: int, steps: int, progress: Callable[[str], None]) -> list[dict]:
    """At each size whose head can take X's products through the embedding
    tables (the bilinear association with fewer queries than positions), attn's
    forward and backward with X formed over with the products looked up
    (attn.model.pairs.LazyEmbeddings), timed side by side; and which one the rule
    (attn.model.pairs.lookup_is_cheaper) picks there."""
    compared = []
    for name in sizes:
        config = size_config(name)
        task, spec, params, _, gens = runstate.build(config)
        batches = batch_pool(task, gens, config)
        P = query_positions(spec, batches)
        association = head.choose_association(
            config.train.batch_size, P, spec.n_positions, spec.d_model, spec.d_k, spec.d_v, spec.width_free, spec.normed
        )
        if P == spec.n_positions or association == "projected":
            continue  # X is formed either way
        pool = itertools.cycle(batches)

        def step(lookup: bool):
            fast.backward(fast.forward(params, spec, next(pool), lookup=lookup)[1], spec)

        sides = timed_side_by_side(
            {"formed": lambda: step(False), "looked up": lambda: step(True)}, warmup, steps, f"{name}: X", progress
        )
        chosen = fast.forward(params, spec, batches[0])[1]["attn"]["x"]  # as training runs it
        compared.append(
            {
                "size": name,
                "sides": sides,
                "ratio": sides["formed"]["median_ms"] / sides["looked up"]["median_ms"],
                "rule": "looked up" if isinstance(chosen, pairs.LazyEmbeddings) else "formed",
            }
        )
    return compared


def blas_info() -> list[dict]:
    from threadpoolctl import threadpool_info

    return [{k: v for k, v in entry.items() if k != "filepath"} for entry in threadpool_info()]


def versions() -> dict:
    """numpy's, and each rival framework's that is installed."""
    found = {"numpy": np.__version__}
    for module in ("torch", "jax"):
        if rivals.available("jax" if module == "jax" else "torch"):
            found[module] = __import__(module).__version__
    return found


def measure(
    sizes: list[str],
    threads: int,
    warmup: int,
    steps: int,
    progress: Callable[[str], None],
    frameworks=rivals.FRAMEWORKS,
) -> dict:
    """Every size at `threads` threads, in this process (whose thread
    environment the parent set; see timed_in_child)."""
    if rivals.available("torch"):
        import torch

        torch.set_num_threads(threads)
    allocator.keep_freed_memory()  # as attn.train.lifecycle.execute_stack does for every stack of runs
    return {
        "threads": threads,
        "blas": blas_info(),
        "versions": versions(),
        "sizes": [bench_size(name, warmup, steps, progress, frameworks) for name in sizes],
        "width": width_ratio(warmup, steps, progress),
        "lookup": lookup_ratio(sizes, warmup, steps, progress),
        # at one thread only: BLAS's other threads keep the mode they started with (attn.train.denormals)
        **({"subnormal": subnormal_ratio(warmup, steps, progress)} if threads == 1 else {}),
    }


def child_environment(threads: int) -> dict:
    env = {**os.environ, **{k: str(threads) for k in THREAD_ENV}}
    xla = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" if threads == 1 else ""
    env["XLA_FLAGS"] = " ".join(filter(None, (env.get("XLA_FLAGS", ""), xla)))
    return env


def timed_in_child(
    sizes: list[str],
    threads: int,
    warmup: int,
    steps: int,
    progress: Callable[[str], None],
    frameworks=rivals.FRAMEWORKS,
) -> dict:
    """measure() in a fresh `python -m attn.bench.timing` with `threads`
    threads everywhere; its progress lines are passed on."""
    command = [
        sys.executable,
        "-m",
        "attn.bench.timing",
        "--threads",
        str(threads),
        "--sizes",
        ",".join(sizes),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--rivals",
        ",".join(frameworks),
    ]
    child = subprocess.Popen(
        command, cwd=REPO, env=child_environment(threads), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    result, other = None, []
    for line in child.stdout:  # one stream, so that neither pipe fills while the other is read
        if line.startswith("{"):
            result = json.loads(line)
        elif line.startswith(PROGRESS_PREFIX):
            progress(line.removeprefix(PROGRESS_PREFIX).rstrip())
        else:
            other = (other + [line.rstrip()])[-5:]  # compiler warnings and the like; kept for an error message
    if child.wait() != 0 or result is None:
        raise RuntimeError(f"the timing child at {threads} threads failed: {' | '.join(other)}")
    return result


def child_main(argv: list[str] | None = None) -> int:
    """The child's entry point: progress lines, then the result as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m attn.bench.timing")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rivals", default=",".join(rivals.FRAMEWORKS))
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=args.threads, user_api="blas"):
        result = measure(
            args.sizes.split(","),
            args.threads,
            args.warmup,
            args.steps,
            lambda message: print(f"{PROGRESS_PREFIX}{args.threads} thread(s): {message}", flush=True),
            [f for f in args.rivals.split(",") if f],
        )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
