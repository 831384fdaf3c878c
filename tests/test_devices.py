"""The fast path's devices switched off from the bench's side (attn.bench.devices): each switch changes the
path it names, the loss and gradients stay those of every device on (float64: to rounding), everything is
put back after; the table's verdicts follow issue 48's rule; the table fills docs/bench.md's block."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attn import publish, results_text
from attn.bench import device_gains, devices
from attn.config.loading import load_config
from attn.model import fast, pairs
from attn.store import runstate
from attn.train import denormals

ROOT = Path(__file__).resolve().parent.parent
# Retrieval with one query of 17 positions, d_k wider than 2 d_model: every step device acts here.
OVERRIDES = ("model.d_k=256", "model.d_v=32", "dtype=float64")


def _state(off=()):
    config = load_config(ROOT / "configs" / "default.yaml", OVERRIDES)
    with devices.switched_off([key for key in off if devices.BY_KEY[key].scope == "build"]):  # as the bench builds
        task, spec, params, _, gens = runstate.build(config)
    return spec, params, task.sample(gens.data, config.train.batch_size)


def _loss_and_grads(off):
    """Loss, gradients, the forward's cache and the type of X's gradient, with the devices `off` switched off."""
    spec, params, batch = _state(off)
    seen, backward = [], pairs.embedding_backward
    with devices.switched_off(off):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                pairs, "embedding_backward", lambda dout, cache: seen.append(type(dout)) or backward(dout, cache)
            )
            loss, cache = fast.forward(params, spec, batch)
            grads = fast.backward(cache, spec)
    return float(loss), grads, cache, seen[0]


ON = _loss_and_grads(())


def _path(key: str, run) -> object:
    """What device `key` decides, read from a step's loss_and_grads (run: its result)."""
    loss, grads, cache, dx_type = run
    head = cache["attn"]
    return {
        "bilinear": head["association"],
        "lookups": type(head["x"]).__name__,
        "factored": dx_type.__name__,
        "merged": head.get("query_map", (None, (None,) * 6))[1][4] is not None,
        "keymajor": head["scores"].flags.c_contiguous,
        "weightlayout": grads["W_k"].flags.c_contiguous,
    }.get(key)


@pytest.mark.parametrize("key", ["bilinear", "lookups", "factored", "merged", "keymajor", "weightlayout"])
def test_a_device_switched_off_takes_its_plain_path_to_the_same_loss(key):
    off = _loss_and_grads((key,))
    assert off[0] == pytest.approx(ON[0], rel=1e-12)
    for name, g in ON[1].items():
        np.testing.assert_allclose(off[1][name], g, rtol=1e-9, atol=1e-12)
    assert _path(key, off) != _path(key, ON), key


def test_the_width_free_head_switched_off_is_materialized():
    spec, params, _ = _state(("widthfree",))
    assert not spec.width_free and params["W_q"].shape == (64, 256)
    assert _state()[0].width_free  # and on, at the same config, width-free


def test_flush_to_zero_switched_off_and_put_back():
    with devices.switched_off(["ftz"]):
        with denormals.flushing():
            assert denormals._bits() in (None, 0)  # kept: not flushed
    if denormals.can_flush():
        with denormals.flushing():
            assert denormals._bits() == denormals.FTZ_DAZ


def test_every_patch_is_put_back_after_the_block():
    patched = [(owner, name) for device in devices.DEVICES for owner, name, _ in device.patches()]
    before = [getattr(owner, name) for owner, name in patched]
    with pytest.raises(RuntimeError):
        with devices.switched_off(list(devices.BY_KEY)):
            raise RuntimeError
    assert [getattr(owner, name) for owner, name in patched] == before


def test_a_sweep_environment_switches_devices_off_in_a_fresh_process(tmp_path):
    env = {**os.environ, **devices.sweep_environment(["ftz"], tmp_path, ROOT)}
    code = "from attn.train import denormals; print(denormals.flushing.__name__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "_keeping_subnormals"


def _cell(ratio_of: dict) -> dict:
    return {side: {"per_member_s": ratio, "ratio": ratio, "members": 1} for side, ratio in ratio_of.items()}


def test_the_verdicts_follow_the_rule_and_the_table_fills_the_block(tmp_path):
    cell = _cell(
        {
            "on": 1.0,
            "bilinear": 2.0,
            "keymajor": 1.01,
            "gone": 1.03,
            "went": 1.01,
            "gone, went": 1.12,
            "widthfree": 1.02,
            "all off": 2.1,
            "on (again)": 1.0,
        }
    )
    result = {
        "devices": {
            **{d.key: {"name": d.name, "off": d.off, "required": d.required} for d in devices.DEVICES},
            "gone": {"name": "a device removed since", "off": "plain", "required": None},
            "went": {"name": "another", "off": "plain", "required": None},
        },
        "date": "2026-12-05",
        "machine": "cpu",
        "attn_commit": "abc",
        "steps": {"sizes": {"default": cell}, "headline": {"16": cell, "64": cell}, "rounds": 5},
        "sweeps": {
            "only": ["model.d_k=64"],
            "rounds": 2,
            "variants": {"on": {"wall_s": 10.0, "ratio": 1.0}, "ftz": {"wall_s": 10.1, "ratio": 1.01}},
        },
    }
    said = device_gains.verdicts(result)
    assert said["bilinear"] == "keep" and said["keymajor"] == "remove" and said["ftz"] == "remove"
    assert said["widthfree"].startswith("keep") and said["lookups"].startswith("keep (not measured")
    assert device_gains.device_share(result, "bilinear") == pytest.approx(1.0)
    doc = tmp_path / "bench.md"
    doc.write_text(f"# speed\n\n{results_text.DEVICES_BEGIN}\nstale table\n{results_text.DEVICES_END}\n")
    publish.write_devices_block(result, doc)
    text = doc.read_text()
    assert "stale table" not in text and "| key-major layouts |" in text and "+100%" in text
    assert "(gone, went), off together side by side with all on: +12.0% of the headline (NOT within" in text
    assert (
        said["gone"] == "remove"
        and "| a device removed since | plain | +3% | +3% | +3% | +3.0% | remove | removed |" in text
    )


def test_the_newest_commit_s_measurements_are_pooled_and_joined_by_the_newest_sweeps(tmp_path, monkeypatch):
    monkeypatch.setattr(device_gains, "_library", lambda result: (result["attn_commit"].replace("HEAD", "new"),))
    meta = {"bilinear": {"name": "bilinear association", "off": "projected", "required": None}}

    def result(commit, ratio, **more):
        cell = _cell({"on": 1.0, "bilinear": ratio})
        steps = {"sizes": {}, "headline": {"16": cell}, "rounds": 8}
        return {"attn_commit": commit, "devices": meta, "date": "d", "machine": "m", "steps": steps, **more}

    for name, r in {
        "devices-1.json": result("old", 9.0),
        "devices-2.json": result("new", 2.0),
        "devices-3.json": result("new", 3.0),
        "devices-4.json": {"attn_commit": "new", "devices": meta, "steps": {}, "code": {"other": "before"}},
    }.items():
        (tmp_path / name).write_text(json.dumps(r))
    joined = device_gains.newest(tmp_path)
    assert joined["steps"]["runs"] == 2 and joined["steps"]["headline"]["16"]["bilinear"]["ratio"] == 2.5
    assert joined["code"] == {"other": "before", "this": "new"}  # made by this checkout's library ("HEAD": new)


def test_a_device_swept_only_by_an_older_measurement_keeps_that_figure_and_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(device_gains, "_library", lambda result: ("lib",))
    meta = {"ftz": {"name": "flush-to-zero", "off": "kept", "required": None}}

    def swept(commit, **variants):
        on = {"on": {"wall_s": 100.0, "ratio": 1.0}}
        ratios = {k: {"wall_s": 100.0 * r, "ratio": r} for k, r in variants.items()}
        sweeps = {"only": ["model.d_k=64"], "rounds": 2, "variants": {**on, **ratios}}
        return {"attn_commit": commit, "devices": meta, "date": f"day {commit}", "machine": "m", "sweeps": sweeps}

    steps = {"sizes": {}, "headline": {"16": _cell({"on": 1.0, "ftz": 1.0})}, "rounds": 8}
    for name, r in {
        "devices-1.json": swept("a", fsyncpool=0.97, ftz=1.2),
        "devices-2.json": {"attn_commit": "b", "devices": meta, "date": "d", "machine": "m", "steps": steps},
        "devices-3.json": swept("c", ftz=1.14, allocator=1.06),
    }.items():
        (tmp_path / name).write_text(json.dumps(r))
    joined = device_gains.newest(tmp_path)
    shares = {k: device_gains.device_share(joined, k) for k in ("ftz", "allocator", "fsyncpool")}
    assert shares == pytest.approx({"ftz": 0.14, "allocator": 0.06, "fsyncpool": -0.03})  # ftz: the newest
    assert [e["attn_commit"] for e in joined["sweeps"]["earlier"]] == ["a"]
    text = device_gains.table(joined)
    assert "fsyncpool off 97 s (-3%)" in text and "Earlier, by attn a on day a" in text and "ftz off 120 s" not in text


def test_a_sweep_alone_in_an_empty_out_directory_says_the_docs_table_was_not_written(tmp_path, monkeypatch, capsys):
    """attn bench --devices --only into a directory without step measurements: its files, exit 0, docs untouched."""
    from attn.cli import main

    meta = {d.key: {"name": d.name, "off": d.off, "required": d.required} for d in devices.DEVICES}
    swept = {"only": ["model.d_k=16"], "rounds": 1, "variants": {"on": {"wall_s": 10.0, "ratio": 1.0}}}
    result = {"devices": meta, "date": "d", "machine": "m", "attn_commit": "abc", "steps": {}, "sweeps": swept}
    monkeypatch.setattr(device_gains, "measure_devices", lambda *args, **kwargs: result)
    monkeypatch.setattr(publish, "write_devices_block", lambda *args: pytest.fail("the docs' table was written"))
    assert main(["bench", "--devices", "--only", "model.d_k=16", "--out", str(tmp_path)]) == 0
    assert len(list(tmp_path.glob("devices-*.json"))) == 1
    assert "not written" in capsys.readouterr().out


def test_a_step_child_runs_the_attn_of_the_checkout_it_is_given(tmp_path, monkeypatch):
    """steps_in_child(code=DIR) starts its child in DIR with DIR first on its path: DIR's library is measured
    (code_steps sets this checkout against an older one)."""
    seen = {}

    class Child:
        stdout = iter(['{"sizes": {}, "headline": {}}\n'])

        def wait(self):
            return 0

    def popen(command, cwd, env, **kwargs):
        seen.update(cwd=cwd, path=env["PYTHONPATH"])
        return Child()

    monkeypatch.setattr(device_gains.subprocess, "Popen", popen)
    assert device_gains.steps_in_child(["default"], [], 1, 1, 0, lambda m: None, (), code=tmp_path) == {
        "sizes": {},
        "headline": {},
    }
    assert seen == {"cwd": tmp_path, "path": str(tmp_path)}
