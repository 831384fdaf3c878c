"""The width-free head (attn.model.widthfree): W_q, W_k, W_v, W_o carried as
coordinates C over an orthonormal basis Q of their initial rows, W = C Q.

Held to the textbook model with the d_k-wide weights formed: in float64 the
loss and every gradient (mapped back, grad W = (grad C) Q) at 1e-12; 200
SGD steps with momentum, weight decay, clipping and a cosine schedule
against the materialized run at 1e-10 (sigma_reparam's sigma too); each
score mode that runs width-free against finite differences; sigma_reparam's
initial buffers those of the materialized model; stacks and resume bit for bit; checkpoints and
the memory estimate of a d_k 2^20 run those of a d_k 2 d_model run.
"""

import dataclasses

import numpy as np
import pytest
from test_reference import T, batch_of, close
from test_stack import MEMBERS, assert_same_run, config, train_alone, train_stack

from attn import optim
from attn.config.loading import build_spec, build_task, estimate_memory_bytes, load_config, replace
from attn.model import fast, gradcheck, head, mechanism, reference, widthfree
from attn.model.fast import ModelSpec
from attn.store import runstate
from attn.train import loop

D, DK, DV = 6, 17, 13  # both circuits wider than 2 D = 12: carried at 12
MODES = [dict(score=mode) for mode in widthfree.WIDTH_FREE_SCORES] + [
    dict(scale="none", causal=True),
    dict(score="sigma_reparam", causal=True),
    dict(score="qk_norm", qk_norm_gain="scalar"),
    dict(score="qk_norm", qk_norm_gain="none", causal=True),
]


def mode_id(mode: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in mode.items())


def spec_of(**kw) -> ModelSpec:
    base = dict(
        fields=(("key", 5), ("value", 6)),
        n_positions=T,
        n_classes=5,
        d_model=D,
        d_k=DK,
        d_v=DV,
        dtype="float64",
        width_free=True,
        temperature_init=0.3,
        mup_zero_init_q=False,
    )
    return ModelSpec(**{**base, **kw})


def bases(spec: ModelSpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Q of the query-key circuit (2D, d_k) and of the value circuit (2D, d_v), from the full draw."""
    full = fast.init_params(dataclasses.replace(spec, width_free=False), np.random.default_rng(seed))
    return (widthfree.coordinates(full["W_q"], full["W_k"])[2], widthfree.coordinates(full["W_v"], full["W_o"].T)[2])


def formed(params: dict, q_qk: np.ndarray, q_ov: np.ndarray) -> dict:
    """The d_k-wide parameters (or gradients: the map is the same linear one) from the carried ones."""
    return {
        **params,
        "W_q": params["W_q"] @ q_qk,
        "W_k": params["W_k"] @ q_qk,
        "W_v": params["W_v"] @ q_ov,
        "W_o": q_ov.T @ params["W_o"],
    }


def formed_buffers(buffers: dict, q_qk: np.ndarray) -> dict:
    """sigma_reparam's d_k-wide v = Q^T v_c from the carried coordinates ({} for other modes)."""
    return {name: vector @ q_qk if name.startswith("v") else vector for name, vector in buffers.items()}


def sigmas(params: dict, buffers: dict) -> list[float]:
    """sigma_reparam's sigma = u^T W v of W_q and of W_k, from the power-iteration buffers."""
    return [buffers[f"u_{w}"] @ params[f"W_{w}"] @ buffers[f"v_{w}"] for w in "qk"]


def test_the_coordinates_span_the_initial_weights_and_form_them_again():
    spec = spec_of()
    carried = fast.init_params(spec, np.random.default_rng(3))
    assert carried["W_q"].shape == (D, 2 * D) and carried["W_o"].shape == (2 * D, D)
    full = fast.init_params(dataclasses.replace(spec, width_free=False), np.random.default_rng(3))
    q_qk, q_ov = bases(spec, 3)
    assert np.allclose(q_qk @ q_qk.T, np.eye(2 * D), atol=1e-14)
    again = fast.materialize_params(carried, spec, np.random.default_rng(3))
    for name, value in full.items():
        assert close(again[name], value), name
        assert close(formed(carried, q_qk, q_ov)[name], value), name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [17, 300])
def test_the_coordinates_without_the_basis_are_those_with_it_bit_for_bit(dtype, width):
    rng = np.random.default_rng(width)
    first, second = (rng.standard_normal((D, width)).astype(dtype) for _ in range(2))
    with_basis, without = widthfree.coordinates(first, second), widthfree.coordinates(first, second, basis=False)
    assert without[2] is None and with_basis[2].shape == (2 * D, width)
    for a, b in zip(with_basis[:2], without[:2]):
        assert a.dtype == b.dtype == np.dtype(dtype) and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("where", ["every", "last"])
@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_loss_and_every_gradient_equal_the_textbook_models(mode, where):
    rng = np.random.default_rng(11)
    spec = spec_of(**mode)
    carried = fast.init_params(spec, np.random.default_rng(5))
    for name in ("W_q", "W_k", "W_v", "W_o"):  # away from the initial coordinates: any C spans the same subspace
        carried[name] = carried[name] + 0.3 * rng.standard_normal(carried[name].shape)
    q_qk, q_ov = bases(spec, 5)
    batch = batch_of(rng, spec, where)
    buffers = fast.init_buffers(spec, carried, np.random.default_rng(9))  # sigma_reparam's u, v_c (2D,)
    loss, grads, _ = fast.loss_and_grads(carried, spec, batch, buffers=buffers)
    full_spec = dataclasses.replace(spec, width_free=False)
    textbook_loss, textbook_grads = reference.loss_and_grads(
        formed(carried, q_qk, q_ov), full_spec, batch, formed_buffers(buffers, q_qk)
    )[:2]
    assert close(loss, textbook_loss)
    mapped = formed(grads, q_qk, q_ov)
    assert set(mapped) == set(textbook_grads)
    for name, value in textbook_grads.items():
        assert close(mapped[name], value), name
    for name in ("W_q", "W_k", "W_v", "W_o"):  # the norms clipping and the logs read are the true ones
        assert np.isclose(optim.squared_norm(grads[name]), optim.squared_norm(textbook_grads[name]), rtol=1e-12)


@pytest.mark.parametrize("association", ["projected", "bilinear"])
@pytest.mark.parametrize("gain", ["scalar", "none"])
def test_qk_norms_mean_runs_over_the_true_d_k_in_either_association(association, gain):
    """RMSNorm of q, k carried at 2 D: rms over the d_k-wide row, formed
    (projected) or from the Gram matrices (bilinear), equals the textbook's."""
    rng = np.random.default_rng(4)
    spec = spec_of(score="qk_norm", qk_norm_gain=gain)
    carried = fast.init_params(spec, np.random.default_rng(6))
    q_qk, q_ov = bases(spec, 6)
    batch = batch_of(rng, spec, "some")
    loss, cache = fast.forward(carried, spec, batch, association=association)
    grads = formed(fast.backward(cache, spec), q_qk, q_ov)
    textbook_loss, textbook_grads = reference.loss_and_grads(
        formed(carried, q_qk, q_ov), dataclasses.replace(spec, width_free=False), batch
    )[:2]
    assert cache["attn"]["association"] == association and close(loss, textbook_loss)
    for name, value in textbook_grads.items():
        assert close(grads[name], value), name


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_every_width_free_mode_passes_the_gradient_check(mode):
    rng = np.random.default_rng(7)
    spec = spec_of(**mode)
    params = fast.init_params(spec, rng)
    buffers = fast.init_buffers(spec, params, rng)  # sigma_reparam's (held fixed: they carry no gradient)
    batch = batch_of(rng, spec, "some")
    report = gradcheck.check_model(
        params,
        lambda p: fast.loss_and_grads(p, spec, batch, buffers=buffers),
        loss=lambda p: fast.forward(p, spec, batch, buffers=buffers)[0],
    )
    assert max(entry.rel_error for entry in report.values()) < 1e-6, gradcheck.format_report(report)


WIDE = [
    "model.d_model=16",
    "model.d_k=40",
    "task.n_keys=8",
    "task.n_values=8",
    "task.n_pairs=4",
    "train.batch_size=16",
    "task.eval_size=64",
    "dtype=float64",
]


@pytest.mark.parametrize("score", ["dot", "sigma_reparam", "qk_norm"])
def test_200_steps_with_momentum_decay_clipping_and_cosine_equal_the_materialized_run(score):
    gain = ["model.qk_norm_gain=scalar"] if score == "qk_norm" else []
    c = load_config(
        None,
        [
            *WIDE,
            f"model.score={score}",
            *gain,
            "optim.lr=0.3",
            "optim.momentum=0.9",
            "optim.weight_decay=0.01",
            "optim.clip_norm=0.5",
            "optim.schedule=cosine",
            "optim.warmup_steps=10",
            "train.steps=200",
        ],
    )
    runs = {}
    for width_free in (True, False):
        run_config = replace(c, **{"model.width_free": width_free})
        task, spec, params, optimizer, gens = runstate.build(run_config)
        assert spec.width_free == width_free
        buffers = fast.init_buffers(spec, params, gens.init)
        clipped = 0
        for step in range(c.train.steps):
            fast.advance_buffers(params, buffers, spec)  # as the training loop: one power-iteration step first
            batch = task.sample(gens.data, c.train.batch_size)
            _, grads, _ = fast.loss_and_grads(params, spec, batch, buffers=buffers)
            clipped += optim.clip_by_global_norm(grads, c.optim.clip_norm) > c.optim.clip_norm
            optimizer.step(params, grads, loop.optim_lr(c, step))
        assert clipped > 0  # the clipping was exercised
        runs[width_free] = fast.materialize_params(params, spec, runstate.make_generators(c.seed).init)
        if score == "sigma_reparam":
            runs[width_free].update(zip(("sigma_q", "sigma_k"), map(np.asarray, sigmas(params, buffers))))
    assert set(runs[True]) == set(runs[False])
    for name, value in runs[False].items():
        assert np.abs(runs[True][name] - value).max() <= 1e-10 * np.abs(value).max(), name


@pytest.mark.parametrize(
    "shared",
    [
        ("model.d_k=40",),
        ("model.d_k=40", "optim.momentum=0.5", "optim.nesterov=true"),
        ("model.d_k=40", "model.score=sigma_reparam"),
        ("model.d_k=40", "model.score=qk_norm", "model.qk_norm_gain=scalar"),
    ],
    ids=["sgd", "nesterov", "sigma_reparam", "qk_norm"],
)  # sigma_reparam: its buffers v_c checkpointed too
def test_a_width_free_stack_and_its_resume_are_each_run_alone_bit_for_bit(tmp_path, shared):
    configs = [config(*shared, *MEMBERS[i]) for i in (0, 2, 3, 4)]  # (1 diverges at d_k 40)
    assert all(build_spec(c, build_task(c)).width_free for c in configs)
    summaries, stacked = train_stack(tmp_path, configs, "stack", stop_at=11)
    assert {s["status"] for s in summaries} == {"interrupted"}
    for i, c in enumerate(configs):
        assert loop.train(c, stacked[i], resume=True)["status"] == "completed"
        _, run_dir = train_alone(tmp_path, c, f"alone{i}")
        assert_same_run(stacked[i], run_dir)


def test_the_cost_rule_chooses_width_free_only_when_valid_and_cheaper():
    assert head.choose_association(64, 1, 9, 64, 1 << 20, 1 << 20, width_free=True) == "widthfree"
    assert head.choose_association(64, 1, 9, 64, 1 << 20, 1 << 20) != "widthfree"
    assert head.choose_association(64, 1, 9, 64, 32, 32, width_free=True) != "widthfree"  # d_k < 2D: no gain
    for overrides in (
        ["optim.name=adam", "optim.lr=0.01"],
        ["model.score=qk_norm"],
        ["model.width_free=false"],
        ["model.score=qk_norm", "model.qk_norm=layer", "model.qk_norm_gain=scalar"],
    ):
        c = load_config(None, ["model.d_k=4096", *overrides])
        assert not build_spec(c, build_task(c)).width_free, overrides
    for overrides in (
        [],
        ["model.score=sigma_reparam"],
        ["model.score=qk_norm", "model.qk_norm_gain=scalar"],
        ["model.score=qk_norm", "model.qk_norm_gain=none"],
    ):
        c = load_config(None, ["model.d_k=4096", *overrides])
        assert build_spec(c, build_task(c)).width_free, overrides


def test_a_d_k_2_20_run_has_the_checkpoint_and_memory_estimate_of_a_d_k_128_run(tmp_path):
    wide, narrow = load_config(None, ["model.d_k=1048576"]), load_config(None, ["model.d_k=128"])
    assert estimate_memory_bytes(wide) == estimate_memory_bytes(narrow)
    sizes = {}
    for name, c in (("wide", wide), ("narrow", narrow)):
        (tmp_path / name).mkdir()
        state = runstate.prepare(c, tmp_path / name)
        runstate.save_checkpoint(state)
        sizes[name] = runstate.checkpoint_file(tmp_path / name).stat().st_size
    assert sizes["wide"] == sizes["narrow"]


def test_sigma_reparams_initial_buffers_are_the_materialized_models_in_coordinates():
    """d_k 17 > 2D, B drawn in full: the same draws (u_k and the generator after), v_c = Q v, the same sigma."""
    spec = spec_of(score="sigma_reparam")
    assert widthfree.sampled_directly(D, DK) and spec.k_width == 2 * D < DK
    made = {}
    for width_free in (True, False):
        rng = np.random.default_rng(21)
        run_spec = dataclasses.replace(spec, width_free=width_free)
        params = fast.init_params(run_spec, rng)
        buffers = fast.init_buffers(run_spec, params, rng)
        made[width_free] = params, buffers, sigmas(params, buffers), rng.standard_normal()
    (_, buffers, sigma, after), (_, full_buffers, full_sigma, full_after) = made[True], made[False]
    assert buffers["v_q"].shape == buffers["v_k"].shape == (2 * D,)
    q_qk = bases(spec, 21)[0]
    for name, value in full_buffers.items():
        assert close(formed_buffers(buffers, q_qk)[name], value), name
        assert close(buffers[name], value @ q_qk.T if name.startswith("v") else value), name  # v_c = Q v
    assert close(sigma, full_sigma) and after == full_after


def test_bartlett_draws_the_gram_matrix_of_gaussian_rows():
    """E[R R^T] = diag(sigma^2) n for 2D rows of width n; the mean of many draws is within a few per cent."""
    rng, sigmas, n = np.random.default_rng(0), np.array([0.5, 0.5, 2.0, 2.0]), 50
    grams = [R @ R.T for R in (widthfree.bartlett(sigmas, n, rng, np.float64) for _ in range(4000))]
    expected = np.diag(sigmas**2) * n
    assert np.abs(np.mean(grams, axis=0) - expected).max() < 0.05 * expected.max()


@pytest.mark.parametrize("mode", [{}, dict(score="qk_norm", qk_norm_gain="scalar")], ids=mode_id)
def test_the_mechanism_rows_of_a_width_free_head_are_the_materialized_heads(mode):
    """Per-row gradient norms and saturation from the coordinates: |grad W| = |grad C| row by row."""
    rng = np.random.default_rng(13)
    spec = spec_of(**mode)
    carried = fast.init_params(spec, np.random.default_rng(5))
    q_qk, q_ov = bases(spec, 5)
    batch = batch_of(rng, spec, "some")
    width_free = mechanism.row_statistics(carried, spec, batch)
    full = mechanism.row_statistics(formed(carried, q_qk, q_ov), dataclasses.replace(spec, width_free=False), batch)
    for name, values in full.items():
        assert np.allclose(width_free[name], values, rtol=1e-12, atol=0, equal_nan=True), name
