"""Score modes (attn.model.scores): each pair against finite differences, every
mode's textbook model against finite differences, the fast model against the
textbook in every association, and a stack of members with a mode (its
learned scalars and sigma_reparam's carried power iteration) against each
member trained alone, stopped and resumed."""

import itertools

import numpy as np
import pytest
from helpers import SIZES, facts_in, without_timing

from attn.config.loading import load_config
from attn.config.yamlio import ConfigError
from attn.model import fast, gradcheck, reference, scores
from attn.model.fast import Batch, ModelSpec
from attn.store import arrayfiles, runs, runstate
from attn.train import loop

B, T, D, DV = 3, 5, 6, 4
TOL = 1e-6
MODES = [
    ("qk_norm", {}),
    ("qk_norm", {"qk_norm": "layer", "qk_norm_gain": "scalar"}),
    ("qk_norm", {"qk_norm_gain": "none"}),
    ("softcap", {"softcap": 2.0}),
    ("temperature", {}),
    ("mup", {}),
    ("sigma_reparam", {}),
    ("log_length", {}),
]


def mode_id(mode) -> str:
    name, extra = mode
    return "-".join([name, *map(str, extra.values())])


def worst(report) -> float:
    return max(r.rel_error for r in report.values())


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def spec_of(name, extra, d_k=3, **kw):
    d_k = 7 if extra.get("qk_norm") == "layer" else d_k  # a LayerNorm over 3 values is all curvature: FD can't follow
    return ModelSpec(
        fields=(("key", 5), ("value", 6)),
        n_positions=T,
        n_classes=5,
        d_model=D,
        d_k=d_k,
        d_v=DV,
        dtype="float64",
        score=name,
        **extra,
        **kw,
    )


def batch_of(rng, spec, where):
    tokens = np.stack([rng.integers(0, v, (B, T)) for _, v in spec.fields], axis=-1)
    mask = rng.random((B, T)) < 0.5 if where == "some" else np.zeros((B, T), bool)
    mask[:, -1] = True
    return Batch(tokens, rng.integers(0, spec.n_classes, (B, T)), mask, np.where(mask, rng.integers(0, T, (B, T)), -1))


def params_of(rng, spec):
    params = fast.init_params(spec, rng)
    if spec.score == "mup":  # zero W_q has a gradient, but every score is 0: perturb it to check the rest too
        params["W_q"] = rng.standard_normal(params["W_q"].shape) * 0.3
    for name in fast.score_param_shapes(spec.score, spec.qk_norm_gain, spec.d_k):
        params[name] = np.asarray(
            params[name] + rng.uniform(0.1, 0.3, params[name].shape)
        )  # away from 1 or 0; an array
    return params, fast.init_buffers(spec, params, rng)


# ---------------------------------------------------------------------------
# Each pair
# ---------------------------------------------------------------------------
def test_softcap_and_multiply_match_finite_differences(rng):
    S, dout = rng.standard_normal((2, B, 4, T)) * 3, rng.standard_normal((2, B, 4, T))
    capped, cache = scores.softcap_forward(S, 2.5)
    assert np.all(np.abs(capped) < 2.5)
    report = gradcheck.check_gradients(
        lambda: float((scores.softcap_forward(S, 2.5)[0] * dout).sum()),
        {"S": S},
        {"S": scores.softcap_backward(dout, cache)},
    )
    assert worst(report) < TOL, gradcheck.format_report(report)
    factor = rng.uniform(0.5, 2.0, (2, 1, 4, 1))
    _, cache = scores.multiply_forward(S, factor)
    dS, product = scores.multiply_backward(dout, cache)
    dfactor = product.sum(axis=(1, 3), keepdims=True)  # over the entries each factor multiplies
    report = gradcheck.check_gradients(
        lambda: float((scores.multiply_forward(S, factor)[0] * dout).sum()),
        {"S": S, "factor": factor},
        {"S": dS, "factor": dfactor},
    )
    assert worst(report) < TOL, gradcheck.format_report(report)


@pytest.mark.parametrize("kind,gain", list(itertools.product(("rms", "layer"), ("vector", "scalar", "none"))))
def test_norm_matches_finite_differences(rng, kind, gain):
    x, dout = rng.standard_normal((2, B, T, 7)), rng.standard_normal((2, B, T, 7))
    g = None if gain == "none" else rng.uniform(0.5, 1.5, (2, 7 if gain == "vector" else 1))
    out, cache = scores.norm_forward(x, g, kind)
    if g is None:
        normed = out
        np.testing.assert_allclose((normed**2).mean(-1), 1, rtol=1e-5) if kind == "rms" else np.testing.assert_allclose(
            normed.mean(-1), 0, atol=1e-12
        )
    dx, dg = scores.norm_backward(dout, cache)
    arrays, analytic = {"x": x}, {"x": dx}
    if g is not None:
        arrays["g"], analytic["g"] = g, dg
    report = gradcheck.check_gradients(
        lambda: float((scores.norm_forward(x, g, kind)[0] * dout).sum()), arrays, analytic
    )
    assert worst(report) < TOL, gradcheck.format_report(report)


@pytest.mark.parametrize("kind,gain", list(itertools.product(("rms", "layer"), ("vector", "scalar", "none"))))
def test_the_gram_form_of_the_normed_scores_matches_finite_differences_and_the_norms(rng, kind, gain):
    """norm(q).norm(k) as r_q r_k x_q M x_k^T: equal to the norms of q, k formed,
    and each of its two pairs (weights -> M, G_q, G_k; rows -> r) against finite differences."""
    d_k = 7
    W_q, W_k = rng.standard_normal((2, 2, D, d_k))  # two members
    g_q, g_k = (None, None) if gain == "none" else rng.uniform(0.5, 1.5, (2, 2, d_k if gain == "vector" else 1))
    x_q, x_k = rng.standard_normal((2, B, 4, D)), rng.standard_normal((2, B, T, D))
    (M, G_q, G_k), cache = scores.gram_forward(W_q, W_k, g_q, g_k, kind)
    r_q, _ = scores.row_norm_forward(x_q, G_q, d_k)
    r_k, _ = scores.row_norm_forward(x_k, G_k, d_k)
    gram_scores = r_q[..., None] * (x_q @ M[:, None] @ x_k.swapaxes(-1, -2)) * r_k[..., None, :]
    q, k = scores.norm_forward(x_q @ W_q[:, None], g_q, kind)[0], scores.norm_forward(x_k @ W_k[:, None], g_k, kind)[0]
    np.testing.assert_allclose(gram_scores, q @ k.swapaxes(-1, -2), rtol=1e-12)

    dM, dG_q, dG_k = rng.standard_normal((3, 2, D, D))
    gains = {} if g_q is None else {"g_q": g_q, "g_k": g_k}

    def weights_side():
        made = scores.gram_forward(W_q, W_k, gains.get("g_q"), gains.get("g_k"), kind)[0]
        return float(sum((a * b).sum() for a, b in zip(made, (dM, dG_q, dG_k))))

    dW_q, dW_k, dg_q, dg_k = scores.gram_backward(dM, dG_q, dG_k, cache)
    analytic = {"W_q": dW_q, "W_k": dW_k, **({} if g_q is None else {"g_q": dg_q, "g_k": dg_k})}
    report = gradcheck.check_gradients(weights_side, {"W_q": W_q, "W_k": W_k, **gains}, analytic)
    assert worst(report) < TOL, gradcheck.format_report(report)

    dr = rng.standard_normal(r_k.shape)
    G = G_k + 0.0  # an array of its own, for the check to perturb
    dG, dx = scores.row_norm_backward(dr, scores.row_norm_forward(x_k, G, d_k)[1])
    report = gradcheck.check_gradients(
        lambda: float((scores.row_norm_forward(x_k, G, d_k)[0] * dr).sum()), {"x": x_k, "G": G}, {"x": dx, "G": dG}
    )
    assert worst(report) < TOL, gradcheck.format_report(report)


def test_spectral_reparametrisation_matches_finite_differences_and_tracks_sigma(rng):
    W, gamma = rng.standard_normal((2, D, 9)), np.array([0.7, 1.3])
    u, v = rng.standard_normal((2, D)), rng.standard_normal((2, 9))
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    for _ in range(50):
        scores.power_iteration(W, u, v)
    for m in range(2):
        assert np.isclose(np.einsum("i,ij,j->", u[m], W[m], v[m]), np.linalg.norm(W[m], 2), rtol=1e-10)
    dout = rng.standard_normal(W.shape)
    out, cache = scores.spectral_forward(W, gamma, u, v)
    assert np.allclose(np.linalg.norm(out[0], 2), gamma[0], rtol=1e-10)  # gamma is W's spectral norm
    dW, dgamma = scores.spectral_backward(dout, cache)
    report = gradcheck.check_gradients(
        lambda: float((scores.spectral_forward(W, gamma, u, v)[0] * dout).sum()),
        {"W": W, "gamma": gamma},
        {"W": dW, "gamma": dgamma},
    )
    assert worst(report) < TOL, gradcheck.format_report(report)


# ---------------------------------------------------------------------------
# Each mode, in the whole model
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES, ids=mode_id)
@pytest.mark.parametrize("causal,where", [(False, "some"), (True, "last")], ids=["unmasked", "causal"])
def test_each_modes_textbook_gradients_match_finite_differences(rng, mode, causal, where):
    spec = spec_of(*mode, causal=causal)
    params, buffers = params_of(rng, spec)
    batch = batch_of(rng, spec, where)
    report = gradcheck.check_model(
        params,
        lambda p: reference.loss_and_grads(p, spec, batch, buffers),
        loss=lambda p: reference.forward(p, spec, batch, buffers)[0],
    )
    assert set(report) == set(fast.param_shapes(spec))
    assert worst(report) < TOL, gradcheck.format_report(report)


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
@pytest.mark.parametrize("association", ("projected", "bilinear"))
@pytest.mark.parametrize("d_k,causal,where", [(3, False, "some"), (9, True, "last")], ids=["narrow", "wide-causal"])
def test_each_mode_in_the_fast_model_equals_the_textbook(rng, mode, association, d_k, causal, where):
    spec = spec_of(*mode, d_k=d_k, causal=causal)
    params, buffers = params_of(rng, spec)
    batch = batch_of(rng, spec, where)
    loss, cache = fast.forward(params, spec, batch, association=association, buffers=buffers)
    grads = fast.backward(cache, spec)
    assert cache["attn"]["association"] == association  # qk_norm's bilinear form goes through its Gram matrices
    ref_loss, ref_grads, _ = reference.loss_and_grads(params, spec, batch, buffers)
    assert np.isclose(loss, ref_loss, rtol=1e-12)
    for name in ref_grads:
        scale = np.abs(ref_grads[name]).max()
        assert np.abs(grads[name] - ref_grads[name]).max() <= 1e-11 * max(scale, 1e-300), name


@pytest.mark.parametrize("kind,gain", [("rms", "vector"), ("layer", "scalar"), ("rms", "none")])
@pytest.mark.parametrize("queries", ["last", "every"])
def test_the_gram_form_stacked_gives_each_member_its_own_numbers(rng, kind, gain, queries):
    """qk_norm's bilinear (Gram) form in float32, three members with their own
    weights, gains and scales: each member's loss and gradients bit for bit
    those of its model alone."""
    spec = ModelSpec(
        fields=(("key", 5), ("value", 6)),
        n_positions=T,
        n_classes=5,
        d_model=D,
        d_k=9,
        d_v=DV,
        score="qk_norm",
        qk_norm=kind,
        qk_norm_gain=gain,
    )
    members = [params_of(rng, spec)[0] for _ in range(3)]
    members = [{name: w.astype(np.float32) for name, w in m.items()} for m in members]
    stacked = {name: np.stack([m[name] for m in members]) for name in members[0]}
    tokens = np.stack([rng.integers(0, v, (3, B, T)) for _, v in spec.fields], axis=-1)
    mask = np.zeros((3, B, T), bool)
    mask[..., -1] = True
    if queries == "every":
        mask[:] = True
    batch = Batch(tokens, rng.integers(0, spec.n_classes, (3, B, T)), mask, np.where(mask, 0, -1))
    scales = np.array([0.3, 0.5, 0.9], dtype=np.float32)
    loss, cache = fast.forward(stacked, spec, batch, scale=scales, association="bilinear")
    grads = fast.backward(cache, spec)
    for m, params in enumerate(members):
        alone = Batch(*(field[m] for field in (batch.tokens, batch.targets, batch.target_mask, batch.target_key)))
        loss_m, cache_m = fast.forward(params, spec, alone, scale=scales[m], association="bilinear")
        grads_m = fast.backward(cache_m, spec)
        assert loss[m] == loss_m
        assert all(np.array_equal(grads[name][m], grads_m[name]) for name in grads_m), m


def test_modes_start_from_the_same_weights_and_mup_zeroes_w_q(rng):
    """Every mode draws the same initial weights for a seed (its own parameters
    take no draw), so modes compare paired; mup zeroes W_q, and a temperature
    starts at the scale's own s unless told otherwise."""
    dot = fast.init_params(spec_of("dot", {}, d_k=7), np.random.default_rng(5))
    for name, extra in MODES:
        mode = fast.init_params(spec_of(name, extra, d_k=7), np.random.default_rng(5))
        for key in dot:
            if not (name == "mup" and key == "W_q") and dot[key].shape == mode[key].shape:
                assert np.array_equal(dot[key], mode[key]), (name, key)
        if name == "mup":
            assert not mode["W_q"].any()
    theta = fast.init_params(spec_of("temperature", {}, d_k=16), rng)["theta"]
    assert np.isclose(np.exp(theta), 16**-0.5)


# ---------------------------------------------------------------------------
# Training with a mode: stacked, stopped, resumed
# ---------------------------------------------------------------------------
SHORT = [*SIZES, "logging.plots=false", "train.steps=30", "logging.log_every=5", "logging.checkpoint_every=10"]


@pytest.mark.parametrize("mode", ["sigma_reparam", "temperature", "qk_norm", "log_length"])
def test_a_mode_trains_stacked_and_resumes_each_member_exactly(tmp_path, mode):
    configs = [
        load_config(None, [*SHORT, f"model.score={mode}", f"seed={s}", f"optim.lr={lr}"])
        for s, lr in ((0, 0.2), (1, 0.4))
    ]
    states = []
    for i, config in enumerate(configs):
        (tmp_path / f"stack{i}").mkdir()
        states.append(runstate.prepare(config, tmp_path / f"stack{i}"))
    stop = loop.StopFlag()
    summaries = loop.run_stack(
        states, stop=stop, progress=lambda _m, step, _r: stop.request("SIGTERM") if step == 12 else None
    )
    assert {s["status"] for s in summaries} == {"interrupted"}
    for i, config in enumerate(configs):
        assert loop.train(config, tmp_path / f"stack{i}", resume=True)["status"] == "completed"
        (tmp_path / f"alone{i}").mkdir()
        loop.train(config, tmp_path / f"alone{i}")
        records = runs.read_metrics(tmp_path / f"stack{i}")
        assert without_timing(records) == without_timing(runs.read_metrics(tmp_path / f"alone{i}"))
        own = fast.score_param_shapes(mode, "vector", config.model.d_k)
        assert all(f"grad_norm/{name}" in records[0] for name in own)
        saved = arrayfiles.load_arrays(tmp_path / f"stack{i}" / "checkpoint.npz")
        alone = arrayfiles.load_arrays(tmp_path / f"alone{i}" / "checkpoint.npz")
        assert all(np.array_equal(saved[k], alone[k]) for k in saved if k != "meta")
        assert any(k.startswith("optim/buffer/") for k in saved) == (mode == "sigma_reparam")


def test_a_modes_own_setting_under_another_mode_is_refused():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.softcap=5"])
    assert facts_in(str(info.value), "model.softcap: got 5.0", "model.score softcap")
    assert load_config(None, ["model.score=softcap", "model.softcap=5"]).model.softcap == 5.0
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.score=cosine"])
    assert facts_in(str(info.value), "model.score: got 'cosine'", ", ".join(scores.SCORE_MODES))


@pytest.mark.parametrize(
    "mode,extra", [("mup", []), ("log_length", []), ("temperature", ["model.temperature_init=0.5"])]
)
def test_a_mode_that_does_not_read_the_scale_refuses_it(mode, extra):
    """mup, log_length and a temperature set at init fix their own s: model.scale away from its default is refused."""
    for scale in ("none", "linear"):
        with pytest.raises(ConfigError, match=rf"model.scale: got '{scale}'; not read with model.score {mode}"):
            load_config(None, [f"model.score={mode}", *extra, f"model.scale={scale}"])
    assert load_config(None, [f"model.score={mode}", *extra]).model.scale == "sqrt"
    # a temperature starting from model.scale's s (temperature_init null) reads it
    assert load_config(None, ["model.score=temperature", "model.scale=none"]).model.scale == "none"
    for reads in ("dot", "qk_norm", "softcap", "sigma_reparam"):
        assert load_config(None, [f"model.score={reads}", "model.scale=none"]).model.scale == "none"
