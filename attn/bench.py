"""Benchmark: attn's training step against the same model in PyTorch eager on the CPU.

    python -m attn bench [--sizes default,mid,large] [--steps 50] [--warmup 10] [--threads N]
                         [--out runs/bench] [--no-torch] [--no-processes] [--unset-coretype]

What one run measures, in one process, so that every ratio compares figures
taken under the same load:

- the training step (forward, backward, optimiser update; batches are drawn
  beforehand, so sampling is not timed) of attn and of the identical model
  written in PyTorch eager (`torch_loss`, same weights, same batches, same
  thread count, torch.optim.SGD with the config's settings), at each size of
  SIZES. Median and spread over `steps` steps after `warmup`.
- the machine's float32 matrix-multiply rate: numpy's (and PyTorch's)
  product of two n x n squares, n = MATMUL_N, at the start; and numpy's again
  once in each round of every size. The two steps and that product alternate
  in ROUNDS rounds, so a burst of load elsewhere on the machine hits all
  three. Each step's achieved rate is its matrix-multiply FLOPs (`step_flops`)
  over its median time, as a fraction of the product's median rate in the
  same rounds. Alongside, the step's largest product, [K V] = X [W_k W_v],
  timed alone in the same rounds: where that product dominates a step (attn
  at the large size), its rate bounds the step's.
- the peak memory (ru_maxrss) of `python -m attn train` for a short run at
  each size, and the throughput of a sweep (runs per minute) with one worker
  and with one per core, through the real sweep runner (attn.sweep).
- which BLAS library and kernel numpy uses, its threads, and OPENBLAS_CORETYPE.
  With `unset_coretype`, the step timings are taken again in a child process
  whose environment lacks OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE.

Matrix-multiply FLOPs of one training step (2 per multiply-add), with C
classes, d = d_k + d_v, and the query side computed at Q of the T positions

    query(Q)   = 2 B Q D d_k + 2 B Q d_v D + 2 B Q D C   Q_s = X_Q s W_q, (A V) W_o, H W_out at Q
    scores(Q)  = 2 B Q T d                               S = Q_s K^T, A V
    forward(Q) = 2 B T D d + query(Q) + scores(Q)        K, V = X W_k, X W_v at all T

    model     3 forward(T)                               PyTorch's: autograd gives every product
                                                         U W two more, dU and dW
    attn      forward(P) + 2 query(P) + scores(P) + KV(P)
                                                         the query side, forward and backward, only
                                                         at the P positions where some example has
                                                         a target (retrieval 1, copy T); dQ = dS K,
                                                         dA = dC V^T

KV(P) is attn.layers.key_value_backward_flops of the path the step takes
(the keys' and values' gradient: formed, 2 forward(T) - 2 query(T) -
scores(T) at P = T; or factored, with the positional table's product of the
factors; see attn.layers.factored_key_value_backward). X's gradient
flows on into the embeddings: a scatter, not counted (attn's one-hot
products are not counted either). Element-wise work (softmax, cross-entropy,
the update) is not counted.

Each step's rate is reported two ways, as fractions of the square product's:
on its own FLOPs (how close the step comes to spending all its time in
matrix multiplies) and on the model's FLOPs, the same count for both sides
(how its time compares with the model's full computation at the machine's
matrix-multiply rate; above 100% when a step skips work the model defines,
as attn's does).

PyTorch is optional: without it (or with `with_torch=False`) only attn is timed.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from attn import allocator, layers, model, runs, train
from attn.config import Config, load_config, to_dict
from attn.model import Batch, ModelSpec

REPO = Path(__file__).resolve().parent.parent
BASE_CONFIG = REPO / "configs" / "default.yaml"
# name -> overrides of configs/default.yaml. The large size is retrieval with
# 63 pairs (T = 64); its learning rate is lowered so that every timed step
# stays finite (at 0.5 it diverges within ten steps): the cost of a step does
# not depend on the rate.
SIZES = {
    "default": (),
    "mid": ("task.name=retrieval", "train.batch_size=64", "model.d_k=256"),
    "large": ("task.name=retrieval", "task.n_keys=64", "task.n_pairs=63", "train.batch_size=128",
              "model.d_model=256", "model.d_k=256", "optim.lr=0.1"),
}
MATMUL_N = 2048
BATCH_POOL = 16  # distinct batches cycled through by the timed steps
ROUNDS = 5  # alternating rounds of attn, PyTorch and one matmul per size
COMPARE_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# ---------------------------------------------------------------------------
# Sizes and FLOPs
# ---------------------------------------------------------------------------
def size_config(name: str) -> Config:
    """configs/default.yaml with the overrides of size `name`."""
    return load_config(BASE_CONFIG, SIZES[name])


def step_flops(spec: ModelSpec, batch_size: int, positions: int | None = None) -> int:
    """Matrix-multiply FLOPs of one training step: the model's (positions
    None; what PyTorch does) or attn's, whose query side runs at `positions`
    of the T positions; see the module docstring."""
    B, T, D, C, d_k, d_v = batch_size, spec.n_positions, spec.d_model, spec.n_classes, spec.d_k, spec.d_v

    def query(Q: int) -> int:
        return 2 * B * Q * D * d_k + 2 * B * Q * d_v * D + 2 * B * Q * D * C

    def scores(Q: int) -> int:
        return 2 * B * Q * T * (d_k + d_v)

    def forward(Q: int) -> int:
        return 2 * B * T * D * (d_k + d_v) + query(Q) + scores(Q)

    if positions is None:
        return 3 * forward(T)
    head = min(layers.head_costs(B, positions, T, D, d_k, d_v).values())  # multiply-adds of the association taken
    return 2 * head + 3 * 2 * B * positions * D * C  # and the readout's three products


def key_value_product(spec: ModelSpec, batch_size: int) -> tuple[Callable, int]:
    """(function, FLOPs): the step's largest product, [K V] = X [W_k W_v], on random float32 data."""
    rows, d = batch_size * spec.n_positions, spec.d_k + spec.d_v
    x, w, out = product_operands(rows, spec.d_model, d)
    return (lambda: np.matmul(x, w, out=out)), 2 * rows * spec.d_model * d


def describe_size(config: Config, spec: ModelSpec) -> dict:
    return {"task": config.task.name, "B": config.train.batch_size, "T": spec.n_positions, "d_model": spec.d_model,
            "d_k": spec.d_k, "d_v": spec.d_v, "classes": spec.n_classes, "dtype": spec.dtype}


# ---------------------------------------------------------------------------
# The PyTorch twin of attn.model (also the reference of tests/test_torch_reference.py)
# ---------------------------------------------------------------------------
def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def torch_batch(batch: Batch) -> tuple:
    """(tokens, targets, target_mask) as torch tensors sharing the batch's memory."""
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in (batch.tokens, batch.targets, batch.target_mask))


def torch_params(params: dict[str, np.ndarray]) -> dict:
    """Leaf tensors with copies of attn's parameters (same names, same dtype)."""
    import torch

    return {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}


def torch_loss(params: dict, spec: ModelSpec, batch: tuple):
    """attn.model.forward's loss, written with PyTorch ops (autograd does the backward)."""
    import torch
    import torch.nn.functional as F

    tokens, targets, target_mask = batch
    T = tokens.shape[1]
    x = F.embedding(tokens[..., 0], params[f"E_{spec.fields[0][0]}"])  # (B, T, D)
    for f, (name, _) in enumerate(spec.fields[1:], start=1):
        x = x + F.embedding(tokens[..., f], params[f"E_{name}"])
    if spec.positional == "learned":
        x = x + params["E_pos"][:T]
    else:
        x = x + torch.from_numpy(model.sinusoidal_positions(T, spec.d_model, spec.n_sources ** -0.5, spec.dtype).copy())
    q, k, v = x @ params["W_q"], x @ params["W_k"], x @ params["W_v"]  # (B, T, d_k), (B, T, d_k), (B, T, d_v)
    scores = (q @ k.transpose(1, 2)) * spec.score_scale  # (B, T, T)
    if spec.causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v) @ params["W_o"]  # (B, T, D)
    h = x + out if spec.residual else out
    logits = h @ params["W_out"] + params["b_out"]  # (B, T, C)
    return F.cross_entropy(logits[target_mask], targets[target_mask])


def torch_optimizer(config: Config, params: dict):
    """torch.optim.SGD with the config's settings, one group per parameter (for lr_mult)."""
    import torch

    o = config.optim
    if o.name != "sgd":
        raise ValueError(f"optim.name: got {o.name!r}; the PyTorch twin is written for sgd only")
    groups = [{"params": [p], "lr": o.lr * o.lr_mult.get(name, 1.0)} for name, p in params.items()]
    return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)


def attn_stepper(config: Config, spec: ModelSpec, params: dict, optimizer, batches: list[Batch]) -> Callable:
    """step() -> loss: one training step of attn on the next batch of the pool."""
    pool = itertools.cycle(batches)

    def step():
        loss, grads, _ = model.loss_and_grads(params, spec, next(pool))
        optimizer.step(params, grads, config.optim.lr)
        return loss

    return step


def torch_stepper(config: Config, spec: ModelSpec, params: dict, batches: list[Batch]) -> Callable:
    """step() -> loss: the same step in PyTorch, from copies of `params`."""
    weights = torch_params(params)
    optimizer = torch_optimizer(config, weights)
    pool = itertools.cycle([torch_batch(b) for b in batches])

    def step():
        optimizer.zero_grad()
        loss = torch_loss(weights, spec, next(pool))
        loss.backward()
        optimizer.step()
        return loss

    return step


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------
def spread(seconds: list[float]) -> dict:
    """Median, quartiles and extremes, in milliseconds."""
    ms = np.asarray(seconds) * 1e3
    p25, median, p75 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(median), "p25_ms": float(p25), "p75_ms": float(p75),
            "min_ms": float(ms.min()), "max_ms": float(ms.max()), "n": int(ms.size)}


def time_interleaved(work: dict[str, tuple[Callable, int]], rounds: int) -> dict[str, list[float]]:
    """name -> the seconds of each call, where work[name] = (function, calls
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
                    start = time.perf_counter()
                    function()
                    times[name].append(time.perf_counter() - start)
    finally:
        gc.enable()
    return times


def product_operands(m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random float32 a (m, k), b (k, n) and an output buffer (m, n), for timing a @ b."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    return a, b, np.empty((m, n), dtype=np.float32)


def square_matmuls(n: int, with_torch: bool) -> dict[str, Callable]:
    """library -> a function computing one float32 n x n @ n x n product (2 n^3 FLOPs)."""
    a, b, out = product_operands(n, n, n)
    products = {"numpy": lambda: np.matmul(a, b, out=out)}
    if with_torch:
        import torch

        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        products["torch"] = lambda: torch.matmul(ta, tb, out=tout)
    return products


def gflops(flops: float, seconds: list[float]) -> dict:
    return {"gflops": flops / float(np.median(seconds)) / 1e9, "gflops_best": flops / min(seconds) / 1e9}


def matmul_rate(n: int = MATMUL_N, repeats: int = 5, with_torch: bool = True) -> dict:
    """float32 n x n products in GFLOP/s, numpy's then PyTorch's: median and best of `repeats`."""
    result = {"n": n}
    for library, product in square_matmuls(n, with_torch).items():
        product()  # warm-up
        result[library] = gflops(2.0 * n**3, time_interleaved({library: (product, repeats)}, rounds=1)[library])
    return result


def bench_size(name: str, warmup: int, steps: int, with_torch: bool) -> dict:
    """Time attn's step (and PyTorch's) at one size, in rounds with numpy's
    MATMUL_N-square product, whose rate in the same rounds is the yardstick."""
    config = size_config(name)
    task, spec, params, optimizer, gens = train.build(config)
    batches = [task.sample(gens.data, config.train.batch_size) for _ in range(BATCH_POOL)]
    steppers = {}
    if with_torch:  # before attn's steps change params in place
        steppers["torch"] = torch_stepper(config, spec, params, batches)
    steppers["attn"] = attn_stepper(config, spec, params, optimizer, batches)
    for step in steppers.values():
        for _ in range(warmup):
            step()
    per_round = math.ceil(steps / ROUNDS)
    work = {side: (step, per_round) for side, step in steppers.items()}
    work["matmul"] = (square_matmuls(MATMUL_N, with_torch=False)["numpy"], 1)
    kv_product, kv_flops = key_value_product(spec, config.train.batch_size)
    work["kv_product"] = (kv_product, per_round)
    times = time_interleaved(work, ROUNDS)
    matmul = gflops(2.0 * MATMUL_N**3, times.pop("matmul"))
    kv_rate = gflops(kv_flops, times.pop("kv_product"))
    target_positions = int(batches[0].target_mask.any(axis=0).sum())
    flops = {"torch": step_flops(spec, config.train.batch_size),
             "attn": step_flops(spec, config.train.batch_size, target_positions)}
    result = {"size": name, "overrides": list(SIZES[name]), "shape": describe_size(config, spec),
              "target_positions": target_positions, "gflop_per_step": flops["torch"] / 1e9,
              "attn_gflop_per_step": flops["attn"] / 1e9, "matmul_in_rounds": matmul,
              "kv_product": {**kv_rate, "matmul_fraction": kv_rate["gflops"] / matmul["gflops"]}}
    for side, seconds in times.items():
        stats = spread(seconds)
        seconds_per_step = stats["median_ms"] / 1e3
        result[side] = {**stats, "loss_after": steppers[side]().item(),
                        "matmul_fraction": flops[side] / seconds_per_step / 1e9 / matmul["gflops"],
                        "model_matmul_fraction": flops["torch"] / seconds_per_step / 1e9 / matmul["gflops"]}
    if with_torch:
        result["ratio"] = result["attn"]["median_ms"] / result["torch"]["median_ms"]
        result["ratio_of_min"] = result["attn"]["min_ms"] / result["torch"]["min_ms"]
    return result


# ---------------------------------------------------------------------------
# Processes: peak memory of a training run, sweep throughput
# ---------------------------------------------------------------------------
# A fresh interpreter runs the training as its own child and reports that
# child's ru_maxrss and exit code on stdout. Linux carries a process's peak
# RSS across fork and exec, so a child forked from the benchmark itself
# would report at least the benchmark's own peak.
_PEAK_RSS_OF_CHILD = ("import resource, subprocess, sys; "
                      "code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                      "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)")


def training_peak_memory(name: str, steps: int = 20) -> dict:
    """Peak RSS (ru_maxrss) of `python -m attn train` at size `name` for `steps` steps (no figures)."""
    with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
        command = [sys.executable, "-m", "attn", "train", str(BASE_CONFIG), *SIZES[name],
                   f"train.steps={steps}", f"runs_dir={tmp}", "logging.plots=false"]
        report = subprocess.run([sys.executable, "-c", _PEAK_RSS_OF_CHILD, *command], cwd=REPO, check=True,
                                capture_output=True, text=True).stdout
    max_rss_kib, exit_code = (int(field) for field in report.split())
    return {"size": name, "steps": steps, "peak_rss_mib": max_rss_kib / 1024, "exit_code": exit_code}


def sweep_throughput(workers: list[int], n_runs: int, steps: int) -> dict:
    """Runs per minute of a sweep of `n_runs` default-config runs of `steps` steps
    (figures drawn, as in a real sweep), for each worker count."""
    from attn import sweep

    results = []
    for n_workers in workers:
        with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
            base = to_dict(size_config("default"))
            (Path(tmp) / "base.yaml").write_text(yaml.safe_dump(base))
            experiment_file = Path(tmp) / "throughput.yaml"
            experiment_file.write_text(yaml.safe_dump({
                "name": "throughput", "base": "base.yaml", "overrides": {"train.steps": steps},
                "grid": {"model.scale": ["sqrt"]}, "seeds": list(range(n_runs))}))
            experiment = sweep.load_experiment(experiment_file, runs_dir=str(Path(tmp) / "runs"))
            start = time.perf_counter()
            with sweep.default_executor(n_workers) as executor:
                outcomes = sweep.run_experiment(experiment, executor)
            wall = time.perf_counter() - start
        completed = sum(o.status == "completed" for o in outcomes)
        results.append({"workers": n_workers, "runs": n_runs, "completed": completed, "wall_s": wall,
                        "runs_per_minute": completed / wall * 60})
    return {"steps_per_run": steps, "results": results}


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_info() -> list[dict]:
    from threadpoolctl import threadpool_info

    return [{k: v for k, v in entry.items() if k != "filepath"} for entry in threadpool_info()]


def blas_threads() -> int:
    """Threads of numpy's BLAS (1 if threadpoolctl finds none)."""
    return max((e["num_threads"] for e in blas_info() if e.get("user_api") == "blas"), default=1)


def machine_info(with_torch: bool) -> dict:
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas_info(),
            "blas_threads": blas_threads(), "env": {k: os.environ.get(k) for k in COMPARE_ENV}}
    if with_torch:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


# ---------------------------------------------------------------------------
# The whole benchmark
# ---------------------------------------------------------------------------
def run(sizes: list[str], warmup: int = 10, steps: int = 50, threads: int | None = None, with_torch: bool = True,
        processes: bool = True, unset_coretype: bool = False,
        progress: Callable[[str], None] = lambda message: None) -> dict:
    """Every measurement of the module docstring, as one JSON-ready dict.

    `threads`: BLAS threads of numpy and intra-op threads of PyTorch while
    timing (default: numpy's BLAS threads as the environment set them).
    `progress(message)` is called before each part (the caller may print it).
    """
    from threadpoolctl import threadpool_limits

    allocator.keep_freed_memory()  # as attn.jobs.execute does for every run (PyTorch's tensors gain alike)
    torch_status = ("timed" if torch_available() else "not installed") if with_torch else "not requested"
    with_torch = torch_status == "timed"
    threads = threads or blas_threads()
    result = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "with_torch": with_torch, "torch_status": torch_status,
              "threads": threads, "warmup": warmup, "steps": steps}
    with threadpool_limits(limits=threads, user_api="blas"):
        if with_torch:
            import torch

            torch.set_num_threads(threads)
        result["machine"] = machine_info(with_torch)
        progress(f"float32 matmul rate at {MATMUL_N}x{MATMUL_N}, {threads} threads")
        result["matmul"] = matmul_rate(with_torch=with_torch)
        result["sizes"] = []
        for name in sizes:
            progress(f"training step at size {name}" + (" (attn and PyTorch)" if with_torch else " (attn)"))
            result["sizes"].append(bench_size(name, warmup, steps, with_torch))
    if processes:
        result["memory"] = []
        for name in sizes:
            progress(f"peak memory of a training process at size {name}")
            result["memory"].append(training_peak_memory(name))
        cores = os.cpu_count() or 1
        progress(f"sweep throughput with 1 and {cores} workers")
        result["sweep"] = sweep_throughput(sorted({1, cores}), n_runs=2 * cores, steps=200)
    if unset_coretype:
        progress("step timings again with " + " and ".join(COMPARE_ENV) + " unset (child process)")
        result["coretype_unset"] = rerun_without_coretype(sizes, warmup, steps, threads, with_torch)
    return result


def rerun_without_coretype(sizes: list[str], warmup: int, steps: int, threads: int, with_torch: bool) -> dict:
    """The step timings of `python -m attn bench` in a child whose environment lacks COMPARE_ENV."""
    env = {k: v for k, v in os.environ.items() if k not in COMPARE_ENV}
    with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
        command = [sys.executable, "-m", "attn", "bench", "--no-processes", "--out", tmp, "--sizes", ",".join(sizes),
                   "--warmup", str(warmup), "--steps", str(steps), "--threads", str(threads)]
        subprocess.run(command + ([] if with_torch else ["--no-torch"]), cwd=REPO, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (path,) = Path(tmp).glob("*.json")
        return json.loads(path.read_text())


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------
def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ms(stats: dict) -> str:
    return f"{stats['median_ms']:.2f} ({stats['p25_ms']:.2f}–{stats['p75_ms']:.2f})"


def _blas_line(machine: dict) -> str:
    blas = [e for e in machine["blas"] if e.get("user_api") == "blas"]
    described = ", ".join(f"{e.get('internal_api')} {e.get('version')} ({e.get('architecture')} kernel, "
                          f"{_plural(e.get('num_threads'), 'thread')}, {e.get('threading_layer')})" for e in blas) or "no BLAS found"
    env = ", ".join(f"{k}={v}" if v is not None else f"{k} unset" for k, v in machine["env"].items())
    torch = f"; PyTorch {machine['torch']} ({_plural(machine['torch_threads'], 'thread')})" if "torch" in machine else ""
    return f"numpy {machine['numpy']} with {described}; {env}{torch}"


def steps_table(result: dict) -> str:
    """The step timings as a Markdown table."""
    with_torch = result["with_torch"]
    header = ["size", "task, B×T, d_model, d_k", "GFLOP/step: model (attn)", "attn ms: median (IQR)"]
    if with_torch:
        header += ["PyTorch ms: median (IQR)", "attn / PyTorch: median (min)"]
    header += ["numpy matmul GFLOP/s in the rounds", "attn % of matmul rate: own FLOPs (model FLOPs)"]
    if with_torch:
        header += ["PyTorch % of matmul rate"]
    header += ["X [W_k W_v] alone: % of matmul rate"]
    if with_torch:
        header += ["loss after the timed steps: attn, PyTorch"]
    rows = []
    for s in result["sizes"]:
        shape = s["shape"]
        row = [s["size"], f"{shape['task']}, {shape['B']}×{shape['T']}, {shape['d_model']}, {shape['d_k']}",
               f"{s['gflop_per_step']:.3f} ({s['attn_gflop_per_step']:.3f})", _ms(s["attn"])]
        if with_torch:
            row += [_ms(s["torch"]), f"{s['ratio']:.2f}× ({s['ratio_of_min']:.2f}×)"]
        row += [f"{s['matmul_in_rounds']['gflops']:.0f}",
                f"{100 * s['attn']['matmul_fraction']:.0f}% ({100 * s['attn']['model_matmul_fraction']:.0f}%)"]
        if with_torch:
            row += [f"{100 * s['torch']['matmul_fraction']:.0f}%"]
        row += [f"{100 * s['kv_product']['matmul_fraction']:.0f}%"]
        if with_torch:
            row += [f"{s['attn']['loss_after']:.4f}, {s['torch']['loss_after']:.4f}"]
        rows.append(row)
    return runs.markdown_table(header, rows)


def _matmul_line(result: dict) -> str:
    m = result["matmul"]
    line = (f"float32 matmul rate ({m['n']}×{m['n']}, median of 5): numpy {m['numpy']['gflops']:.1f} GFLOP/s "
            f"(best {m['numpy']['gflops_best']:.1f})")
    if "torch" in m:
        line += f", PyTorch {m['torch']['gflops']:.1f} GFLOP/s (best {m['torch']['gflops_best']:.1f})"
    return line


def markdown(result: dict) -> str:
    """The whole result as Markdown: machine, table, memory, sweep."""
    machine = result["machine"]
    lines = [f"### attn benchmark: {result['date']}, {machine['cpu']}, {machine['cores']} cores", "",
             _blas_line(machine) + ".", "", _matmul_line(result) + ".", "",
             f"Training step: forward + backward + SGD update, float32, {_plural(result['threads'], 'thread')}; median and "
             f"interquartile range of {result['steps']} steps after {result['warmup']} warm-up steps"
             + (", attn and PyTorch eager in alternating rounds." if result["with_torch"]
                else f"; PyTorch {result['torch_status']}: attn alone."), "", steps_table(result)]
    if "memory" in result:
        memory = ", ".join(f"{m['size']} {m['peak_rss_mib']:.0f} MiB" for m in result["memory"])
        lines += ["", f"Peak memory (ru_maxrss) of `python -m attn train` for {result['memory'][0]['steps']} steps: "
                  f"{memory}."]
    if "sweep" in result:
        sweep = result["sweep"]
        rates = "; ".join(f"{_plural(r['workers'], 'worker')}: {r['runs_per_minute']:.1f} runs/min "
                          f"({r['completed']}/{r['runs']} runs in {r['wall_s']:.1f} s)" for r in sweep["results"])
        lines += ["", f"Sweep throughput (default config, {sweep['steps_per_run']} steps a run, figures drawn): "
                  f"{rates}."]
    if "coretype_unset" in result:
        child = result["coretype_unset"]
        lines += ["", f"Again in a child process with {' and '.join(COMPARE_ENV)} unset "
                  f"({_blas_line(child['machine'])}; {_matmul_line(child)}):", "", steps_table(child)]
    return "\n".join(lines) + "\n"


def write(result: dict, out_dir: Path) -> dict[str, Path]:
    """bench-<time>.json and .md in out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    paths = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md")}
    runs.write_json(paths["json"], result)
    runs.write_atomic(paths["md"], markdown(result).encode())
    return paths
