"""The benchmark: its FLOP counts against PyTorch's own counter (skipped
without PyTorch), and a short run through the CLI writing its JSON and table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attn import bench, train

ROOT = Path(__file__).resolve().parent.parent


def spec_and_batch(size: str, *overrides: str):
    config = bench.load_config(bench.BASE_CONFIG, [*bench.SIZES[size], *overrides])
    task, spec, params, _, gens = train.build(config)
    return config, spec, params, task.sample(gens.data, config.train.batch_size)


@pytest.mark.parametrize("size,overrides", [("default", ()), ("mid", ()),
                                            ("default", ("task.name=copy", "model.causal=true"))],
                         ids=["default", "mid", "copy-causal"])
def test_model_flops_are_what_pytorch_counts_for_its_step(size, overrides):
    """step_flops(spec, B) against torch.utils.flop_counter on the PyTorch
    twin's forward and backward: every matrix product, counted independently."""
    pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    config, spec, params, batch = spec_and_batch(size, *overrides)
    weights = bench.torch_params(params)
    with FlopCounterMode(display=False) as counter:
        bench.torch_loss(weights, spec, bench.torch_batch(batch)).backward()
    assert counter.get_total_flops() == bench.step_flops(spec, config.train.batch_size)


def test_attn_flops_equal_the_models_when_every_position_has_a_target():
    """With queries at all T and the keys' gradient formed (the outer path),
    attn multiplies what the model does; with one query, far less."""
    config, spec, _, _ = spec_and_batch("default", "task.name=copy")
    B, T = config.train.batch_size, spec.n_positions
    assert bench.step_flops(spec, B, positions=T) == bench.step_flops(spec, B)
    config, spec, _, _ = spec_and_batch("large")
    B, T = config.train.batch_size, spec.n_positions
    assert bench.step_flops(spec, B, positions=1) < bench.step_flops(spec, B) / 5


def test_a_short_bench_writes_its_json_and_table(tmp_path):
    out = subprocess.run([sys.executable, "-m", "attn", "bench", "--sizes", "default", "--steps", "5", "--warmup", "1",
                          "--threads", "1", "--no-torch", "--no-processes", "--out", str(tmp_path)],
                         cwd=ROOT, env={**os.environ, "CI": "true"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (json_path,) = tmp_path.glob("bench-*.json")
    (md_path,) = tmp_path.glob("bench-*.md")
    result = json.loads(json_path.read_text())
    (size,) = result["sizes"]
    assert result["torch_status"] == "not requested" and "torch" not in size
    assert size["attn"]["n"] == 5 and 0 < size["attn"]["min_ms"] <= size["attn"]["median_ms"] <= size["attn"]["max_ms"]
    config, spec, _, _ = spec_and_batch("default")
    assert size["target_positions"] == 1  # retrieval: the query
    assert size["attn_gflop_per_step"] * 1e9 == pytest.approx(bench.step_flops(spec, config.train.batch_size, 1))
    rate = size["matmul_in_rounds"]["gflops"]
    attn_rate = size["attn_gflop_per_step"] / (size["attn"]["median_ms"] / 1e3)
    assert size["attn"]["matmul_fraction"] == pytest.approx(attn_rate / rate)
    assert 0 < size["kv_product"]["matmul_fraction"]
    table = md_path.read_text()
    assert "attn % of matmul rate: own FLOPs (model FLOPs)" in table and "| default |" in table
    assert table in out.stdout
