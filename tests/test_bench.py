"""The benchmark: the cost model that chooses the head's association
(attn.model.head.head_costs) against PyTorch's own FLOP counter on the rivals'
formulations (skipped without PyTorch), and a short run through the CLI
writing its JSON and table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attn.bench import rivals, timing
from attn.config.loading import build_spec, build_task, load_config
from attn.model import fast, head
from attn.store import runstate
from attn.train import denormals, lifecycle

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "formulation,overrides",
    [
        ("projected", ("task.name=copy", "model.causal=true")),
        ("bilinear", ("task.name=copy",)),
        (
            "bilinear",
            ("task.name=copy", "model.d_k=512", "model.width_free=false"),
        ),  # d_k-wide W_q, W_k, as the rival's
        ("projected", ("task.name=copy", "model.d_k=48", "model.d_v=24")),
    ],
    ids=["projected-causal", "bilinear-chained", "bilinear-merged", "projected-dk-dv"],
)
def test_the_head_cost_model_is_what_pytorch_counts(formulation, overrides):
    """With a query at every position (no factored gradient), autograd does
    every product the cost model counts: 2 x head_costs + the readout's three."""
    pytest.importorskip("torch")
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    config = load_config(None, ["model.d_model=32", "train.batch_size=8", *overrides])
    task, spec, params, _, gens = runstate.build(config)
    batch = task.sample(gens.data, config.train.batch_size)
    B, T, D, C = config.train.batch_size, spec.n_positions, spec.d_model, spec.n_classes
    loss = rivals.loss_function(spec, "torch", formulation, slice(None), B)
    weights = {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}
    arrays = [torch.from_numpy(a) for a in (batch.tokens, batch.targets, batch.target_mask.astype("float32"))]
    with FlopCounterMode(display=False) as counter:
        loss(weights, *arrays).backward()
    costs = head.head_costs(B, T, T, D, spec.d_k, spec.d_v)
    assert counter.get_total_flops() == 2 * costs[formulation] + 3 * 2 * B * T * D * C


@pytest.mark.slow
def test_a_short_bench_writes_its_json_and_table(tmp_path):
    command = [
        sys.executable,
        "-m",
        "attn",
        "bench",
        "--sizes",
        "default",
        "--steps",
        "5",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--rivals",
        "torch,jax",
        "--no-processes",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(
        command, cwd=ROOT, env={**os.environ, "CI": "true"}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    (json_path,) = tmp_path.glob("bench-*.json")
    (md_path,) = tmp_path.glob("bench-*.md")
    result = json.loads(json_path.read_text())
    (timed,) = result["timings"]
    (size,) = timed["sizes"]
    assert timed["threads"] == 1 and size["shape"]["P"] == 1  # retrieval: the query
    attn = size["sides"]["attn"]
    assert attn["n"] == 5 and 0 < attn["min_ms"] <= attn["median_ms"] <= attn["max_ms"]
    installed = sorted(s for s in size["sides"] if s != "attn")
    assert installed == sorted(f"{f} {p}" for f in ("torch", "jax") if rivals.available(f) for p in rivals.FORMULATIONS)
    if installed:
        assert size["fastest_rival"] in installed
        assert size["ratio_to_fastest"] == pytest.approx(
            attn["median_ms"] / size["sides"][size["fastest_rival"]]["median_ms"]
        )
    config = timing.size_config("default")
    assert size["attn_gflop_per_step"] * 1e9 == timing.step_flops(
        build_spec(config, build_task(config)), config.train.batch_size, 1
    )
    assert size["attn_calls"] == timing.attn_calls(config)
    (lookup,) = timed["lookup"]  # default: the bilinear head with one query, so X formed against looked up
    assert lookup["size"] == "default" and lookup["rule"] == "looked up" and lookup["sides"]["formed"]["n"] == 5
    assert lookup["ratio"] == pytest.approx(
        lookup["sides"]["formed"]["median_ms"] / lookup["sides"]["looked up"]["median_ms"]
    )
    table = md_path.read_text()
    row = next(line for line in table.splitlines() if line.startswith("| default |"))
    assert "attn / fastest |" in table and f"| {size['attn_calls']['numpy']:.0f}; " in row
    assert installed == [] or "at ≤ 1.0)" in row  # issue 21's target at the default size
    assert f"{lookup['ratio']:.2f}× (the rule: looked up)" in table
    assert result["attn_commit"] == lifecycle.source_revision() and f"attn {result['attn_commit']}" in table
    assert table in out.stdout


# The numpy calls of a training step at the default size (attn.bench.calls): 218 before the embeddings were
# stacked, the residual's gradient joined to the query rows' and the rest of issue 21 item 7's cuts; 160 after
# them; 180 since the head takes X's products through the embedding tables (attn.model.pairs.LazyEmbeddings), which
# left one model's default step about as fast and made stacked and longer-sequence steps faster (docs/bench.md);
# 188 since the embeddings' gradient and the tables' products bin by one function (pairs._binned); 180 since
# the bins' slots are flattened once per X, the table transposed once per X and the cross-entropy's backward
# takes a scalar upstream gradient; 175 since the embeddings' gradient reuses the bins of A and dS that the
# head's A X and dS X made (attn.model.pairs.LazyEmbeddings.binned), binning only the query rows' own; 180 since
# that reuse and the ufunc reductions were removed (issue 48: each saved under 5% of the headline, measured side
# by side in docs/bench.md's devices table).
DEFAULT_STEP_NUMPY_CALLS = 180
# The copy size's (a query at every position: X and its gradient formed, Factored.dense): 149 since 6d8eb63.
COPY_STEP_NUMPY_CALLS = 149


@pytest.mark.parametrize("size, most", [("default", DEFAULT_STEP_NUMPY_CALLS), ("copy", COPY_STEP_NUMPY_CALLS)])
def test_a_step_makes_no_more_numpy_calls_than_it_did(size, most):
    """A count of code paths, not a time: deterministic on any machine."""
    counted = timing.attn_calls(timing.size_config(size))
    assert counted["numpy"] <= most, counted


def test_the_headline_work_is_counted_per_run_and_a_wide_width_free_run_costs_what_a_d_k_4096_one_does(monkeypatch):
    from attn.bench import suite, sweeps
    from attn.experiment.spec import load_experiment
    from attn.train.stack import head_step_cost

    monkeypatch.setattr(sweeps, "matmul_rate", lambda: 1e10)
    work = sweeps.headline_work(lambda message: None)
    experiment = load_experiment(sweeps.HEADLINE, runs_dir="/tmp")
    by_width = {c.config.model.d_k: head_step_cost(c.config) for c in experiment.cells}
    assert by_width[1 << 20] == by_width[4096] < by_width[64] * 4096 // 64, "width-free: no growth with d_k"
    assert work["runs"] == len(experiment.cells)
    assert work["head_multiply_adds"] == sum(
        c.config.train.steps * by_width[c.config.model.d_k] for c in experiment.cells
    )
    assert work["least_seconds"] == work["head_multiply_adds"] / (1e10 * work["cores"])
    assert f"{work['least_seconds']:.0f} s" in suite.work_line(work)


def test_a_headline_sweep_that_fails_is_no_measurement_of_the_headline(monkeypatch):
    """A sweep of this checkout that exits non-zero (a run or its report failed) stops the bench with its error,
    never reported as the headline's wall time."""
    from attn.bench import sweeps

    failed = {"code": sweeps.THIS_CODE, "exit_code": 1, "error": ["failed: a cell: boom"], "wall_s": 2.0}
    failed.update(cpu_s=3.0, cores_busy=1.5, timeline=None, timeline_records=[])
    monkeypatch.setattr(sweeps, "headline_sweep", lambda *args, **kwargs: dict(failed))
    with pytest.raises(RuntimeError, match="exit 1"):
        sweeps.headline_wall_time(lambda message: None, only=("model.d_k=16",))


def test_several_codes_sweep_once_a_round_each_taking_every_place_in_turn(monkeypatch, tmp_path):
    """--headline-code given twice: three codes a round, the order turned by one each round, this checkout's
    medians taken over its own sweeps alone."""
    from attn.bench import sweeps

    order = []

    def sweep(directory, cores, only, code):
        order.append(code)
        wall = 10.0 if code is None else 99.0
        return {
            "code": sweeps.THIS_CODE if code is None else str(code),
            "exit_code": 0,
            "error": None,
            "wall_s": wall,
            "cpu_s": 2 * wall,
            "cores_busy": 2.0,
            "timeline": None,
            "timeline_records": [],
        }

    monkeypatch.setattr(sweeps, "headline_sweep", sweep)
    a, b = tmp_path / "a", tmp_path / "b"
    result = sweeps.headline_wall_time(lambda message: None, ("model.d_k=16",), (a, b), rounds=3)
    assert order == [None, a, b, a, b, None, b, None, a]
    assert len(result["measured"]) == 9 and result["wall_s"] == 10.0


@pytest.mark.skipif(not denormals.can_flush(), reason="subnormals cannot be flushed on this platform")
def test_the_subnormal_comparison_times_gradients_that_are_subnormal_and_flushed_ones_that_are_not():
    spec, params, batches = timing.subnormal_state()
    tiny = np.finfo(params["W_q"].dtype).tiny
    for flush, subnormal_entries in ((False, True), (True, False)):
        with denormals.flushing(flush):
            _, grads, _ = fast.loss_and_grads(params, spec, batches[0])
        # counted with subnormals kept: flushing, a subnormal compares equal to 0
        counts = {name: int(np.count_nonzero((g != 0) & (np.abs(g) < tiny))) for name, g in grads.items()}
        assert (counts["W_q"] > 0 and counts["W_k"] > 0) == subnormal_entries, counts
