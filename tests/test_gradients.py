"""Every backward pass against central finite differences, in float64.

Shapes are deliberately not trivial: batch > 1, T >= 3, T != d_k, odd d_k,
and a random upstream gradient (never all ones). Worst relative error
|a - n| / max(1e-8, |a| + |n|) must be below 1e-6.
"""

import itertools

import numpy as np
import pytest

from attn.model import fast, gradcheck, head, pairs
from attn.model.fast import Batch, ModelSpec

TOL = 1e-6
B, T, D, DK, DV = 3, 5, 6, 3, 4  # T != d_k, odd d_k, d_v != d_k


def worst(report):
    return max(r.rel_error for r in report.values())


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_softmax_backward_matches_finite_differences(rng):
    for masked in (False, True):
        scores = rng.standard_normal((B, T, T)) * 2
        if masked:
            scores[..., head.causal_mask(T)] = -np.inf
        dprobs = rng.standard_normal((B, T, T))
        probs, cache = pairs.softmax_forward(scores)
        analytic = pairs.softmax_backward(dprobs, cache)

        def f():
            return float((pairs.softmax_forward(scores)[0] * dprobs).sum())

        report = gradcheck.check_gradients(f, {"scores": scores}, {"scores": analytic})
        assert worst(report) < TOL, gradcheck.format_report(report)


def test_cross_entropy_backward_matches_finite_differences(rng):
    logits = rng.standard_normal((B, T, 7)) * 1.5
    targets = rng.integers(0, 7, (B, T))
    mask = rng.random((B, T)) < 0.6
    mask[0, 0] = True
    _, cache = pairs.cross_entropy_forward(logits, targets, mask)
    upstream = 1.7  # a scalar loss: the upstream gradient is a random-ish scalar
    analytic = pairs.cross_entropy_backward(upstream, cache)
    report = gradcheck.check_gradients(
        lambda: upstream * float(pairs.cross_entropy_forward(logits, targets, mask)[0]),
        {"logits": logits},
        {"logits": analytic},
    )
    assert worst(report) < TOL, gradcheck.format_report(report)
    assert np.all(analytic[~mask] == 0), "positions without a target get exactly zero gradient"


def test_cross_entropy_is_log_softmax_of_the_target(rng):
    logits = rng.standard_normal((2, 3, 4))
    targets = rng.integers(0, 4, (2, 3))
    mask = np.ones((2, 3), dtype=bool)
    loss, _ = pairs.cross_entropy_forward(logits, targets, mask)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = -np.log(np.take_along_axis(probs, targets[..., None], -1)).mean()
    assert np.isclose(float(loss), expected, rtol=1e-12)


def test_embedding_backward_accumulates_repeated_ids(rng):
    """Two tables looked up and summed at once: each table's gradient, repeated ids adding up."""
    tables = {"first": rng.standard_normal((5, D)), "second": rng.standard_normal((3, D))}
    ids = np.array(
        [
            [[0, 1, 1, 4], [4, 4, 2, 0], [3, 3, 3, 3]],  # repeats on purpose
            [[0, 1, 2, 0], [2, 2, 2, 2], [1, 0, 1, 0]],
        ]
    )  # (S, B, T): row s into table s
    dout = rng.standard_normal(ids.shape[1:] + (D,))
    _, cache = pairs.embedding_forward(ids, list(tables.values()))
    analytic = dict(zip(tables, pairs.embedding_backward(dout, cache)))
    report = gradcheck.check_gradients(
        lambda: float((pairs.embedding_forward(ids, list(tables.values()))[0].dense() * dout).sum()), tables, analytic
    )
    assert worst(report) < TOL, gradcheck.format_report(report)


def test_linear_backward_matches_finite_differences(rng):
    x = rng.standard_normal((B, T, D))
    W = rng.standard_normal((D, 7))
    b = rng.standard_normal(7)
    dout = rng.standard_normal((B, T, 7))
    _, cache = pairs.linear_forward(x, W, b)
    dx, dW, db = pairs.linear_backward(dout, cache)
    report = gradcheck.check_gradients(
        lambda: float((pairs.linear_forward(x, W, b)[0] * dout).sum()),
        {"x": x, "W": W, "b": b},
        {"x": dx, "W": dW, "b": db},
    )
    assert worst(report) < TOL, gradcheck.format_report(report)


@pytest.mark.parametrize("scale,causal", list(itertools.product(sorted(head.SCORE_SCALES), (False, True))))
def test_attention_backward_matches_finite_differences(rng, scale, causal):
    x = rng.standard_normal((B, T, D))
    weights = {
        "W_q": rng.standard_normal((D, DK)) * 0.7,
        "W_k": rng.standard_normal((D, DK)) * 0.7,
        "W_v": rng.standard_normal((D, DV)),
        "W_o": rng.standard_normal((DV, D)),
    }
    s = head.score_scale(scale, DK)
    mask = head.causal_mask(T) if causal else None
    dout = rng.standard_normal((B, T, D))
    _, _, cache = head.attention_forward(x, **weights, scale=s, mask=mask)
    analytic = head.attention_backward(dout, cache)

    def f():
        return float((head.attention_forward(x, **weights, scale=s, mask=mask)[0] * dout).sum())

    report = gradcheck.check_gradients(f, {"x": x, **weights}, analytic)
    assert worst(report) < TOL, gradcheck.format_report(report)


def test_attention_output_shape_and_rows_sum_to_one(rng):
    """The original design's two tests, in float32."""
    x = rng.standard_normal((B, T, D), dtype=np.float32)
    W = {
        n: rng.standard_normal(s, dtype=np.float32)
        for n, s in (("W_q", (D, DK)), ("W_k", (D, DK)), ("W_v", (D, DV)), ("W_o", (DV, D)))
    }
    out, attn, _ = head.attention_forward(x, **W, scale=head.score_scale("sqrt", DK))
    assert out.shape == (B, T, D)
    assert attn.shape == (B, T, T)
    assert np.all(np.abs(attn.sum(axis=-1) - 1) < 1e-5)


def test_masked_positions_get_exactly_zero_weight_and_gradient(rng):
    x = rng.standard_normal((B, T, D))
    W = {n: rng.standard_normal(s) for n, s in (("W_q", (D, DK)), ("W_k", (D, DK)), ("W_v", (D, DV)), ("W_o", (DV, D)))}
    mask = head.causal_mask(T)
    _, attn, cache = head.attention_forward(x, **W, scale=1.0, mask=mask)
    assert np.all(attn[:, mask] == 0.0)
    dscores = pairs.softmax_backward(rng.standard_normal((B, T, T)), cache["attn"])
    assert np.all(dscores[:, mask] == 0.0)
    # and the first query, which may only see itself, puts all its weight there
    assert np.all(attn[:, 0, 0] == 1.0)


def test_softmax_of_huge_scores_stays_finite():
    scores = np.array([[1e4, -1e4, 9999.0, 0.0], [-1e4, -1e4 + 1, -1e4, -1e4]], dtype=np.float32)
    probs, cache = pairs.softmax_forward(scores)
    assert np.all(np.isfinite(probs))
    assert np.allclose(probs.sum(-1), 1, atol=1e-6)
    assert np.isclose(probs[0, 0], 1 / (1 + np.exp(-1.0)), rtol=1e-5)
    assert np.all(np.isfinite(pairs.softmax_backward(np.ones_like(probs) * 0.3 + probs, cache)))


def small_spec(**kw):
    base = dict(
        fields=(("key", 5), ("value", 6)), n_positions=T, n_classes=5, d_model=D, d_k=DK, d_v=DV, dtype="float64"
    )
    base.update(kw)
    return ModelSpec(**base)


def random_batch(rng, spec, mask_fraction=0.6):
    tokens = np.stack([rng.integers(0, v, (B, T)) for _, v in spec.fields], axis=-1)
    targets = rng.integers(0, spec.n_classes, (B, T))
    mask = rng.random((B, T)) < mask_fraction
    mask[:, -1] = True
    target_key = np.where(mask, rng.integers(0, T, (B, T)), -1)
    return Batch(tokens, targets, mask, target_key)


MODEL_VARIANTS = [
    dict(scale="sqrt"),
    dict(scale="none"),
    dict(scale="linear"),
    dict(scale="sqrt", causal=True),
    dict(scale="none", mask_self=True),
    dict(scale="none", residual=False),
    dict(scale="sqrt", positional="sinusoidal"),
    dict(scale="sqrt", fields=(("token", 7),), n_classes=7, qk_gain=2.0),
]


@pytest.mark.parametrize("variant", MODEL_VARIANTS, ids=lambda v: ",".join(f"{k}={v[k]}" for k in v if k != "fields"))
def test_whole_model_gradients_match_finite_differences(rng, variant):
    spec = small_spec(**variant)
    params = fast.init_params(spec, rng)
    batch = random_batch(rng, spec)
    report = gradcheck.check_model(
        params, lambda p: fast.loss_and_grads(p, spec, batch), loss=lambda p: fast.forward(p, spec, batch)[0]
    )
    assert set(report) == set(fast.param_shapes(spec))
    assert worst(report) < TOL, gradcheck.format_report(report)


@pytest.mark.parametrize(
    "variant",
    [
        dict(scale="sqrt"),
        dict(scale="none", causal=True),
        dict(scale="linear", residual=False),
        dict(scale="none", mask_self=True),
    ],
    ids=lambda v: ",".join(f"{k}={v[k]}" for k in v),
)
def test_whole_model_gradients_with_targets_only_at_the_last_position(rng, variant):
    """Retrieval's shape: one query per sequence carries the loss, so the
    backward's target-rows-only path (and its factored key/value gradient) runs."""
    spec = small_spec(**variant)
    params = fast.init_params(spec, rng)
    batch = random_batch(rng, spec, mask_fraction=0.0)
    assert batch.target_mask.sum() == B and batch.target_mask[:, -1].all()
    report = gradcheck.check_model(
        params, lambda p: fast.loss_and_grads(p, spec, batch), loss=lambda p: fast.forward(p, spec, batch)[0]
    )
    assert worst(report) < TOL, gradcheck.format_report(report)


def test_float32_in_gives_float32_out_everywhere(rng):
    spec = small_spec(dtype="float32")
    params = fast.init_params(spec, rng)
    assert all(p.dtype == np.float32 for p in params.values())
    batch = random_batch(rng, spec)
    loss, grads, cache = fast.loss_and_grads(params, spec, batch)
    assert loss.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values()), {n: g.dtype for n, g in grads.items()}
    assert cache["attn"]["attn"].dtype == np.float32
    spec64 = small_spec(dtype="float64", positional="sinusoidal")
    params64 = fast.init_params(spec64, rng)
    loss64, grads64, _ = fast.loss_and_grads(params64, spec64, batch)
    assert loss64.dtype == np.float64 and all(g.dtype == np.float64 for g in grads64.values())


def test_initial_scores_have_the_variance_of_footnote_4(rng):
    """Unit-variance X and q, k components => std(q.k) ~ sqrt(d_k) * s * gain^2."""
    for d_k, scale, gain in ((64, "none", 1.0), (256, "none", 1.0), (256, "sqrt", 1.0), (64, "sqrt", 2.0)):
        spec = ModelSpec(
            fields=(("token", 64),),
            n_positions=16,
            n_classes=8,
            d_model=128,
            d_k=d_k,
            d_v=8,
            scale=scale,
            qk_gain=gain,
            positional="sinusoidal",
        )
        params = fast.init_params(spec, rng)
        tokens = rng.integers(0, 64, (64, 16, 1))
        batch = Batch(tokens, tokens[..., 0] % 8, np.ones((64, 16), bool), -np.ones((64, 16), int))
        _, cache = fast.forward(params, spec, batch)
        x = cache["attn"]["x"]
        assert abs(x.var() - 1) < 0.25, x.var()
        theory = np.sqrt(d_k) * spec.score_scale * gain**2
        measured = fast.diagnostics(cache, batch)["score_std"]
        assert 0.7 * theory < measured < 1.3 * theory, (d_k, scale, gain, measured, theory)


def test_diagnostics_are_read_from_the_forward_cache(rng):
    spec = small_spec(dtype="float64")
    params = fast.init_params(spec, rng)
    batch = random_batch(rng, spec, mask_fraction=1.0)
    _, cache = fast.forward(params, spec, batch)
    stats = fast.diagnostics(cache, batch)
    attn = cache["attn"]["attn"]
    entropy = -(attn * np.log(attn)).sum(-1).mean()
    assert np.isclose(stats["attn_entropy"], entropy)
    assert 0 <= stats["saturated_frac"] <= 1
    expected_target = np.take_along_axis(attn, batch.target_key[..., None], -1).mean()
    assert np.isclose(stats["target_attn"], expected_target)
    assert np.isclose(stats["score_std"], cache["attn"]["scores"].std())
    assert np.isclose(stats["self_attn"], np.diagonal(attn, axis1=-2, axis2=-1).mean())


def test_self_attention_is_the_weight_on_the_query_position_and_zero_under_mask_self(rng):
    """Retrieval's shape (one query, at the last position): self_attn is the
    weight of that row on its own key, and mask_self makes it exactly 0 (a -inf score)."""
    for mask_self in (False, True):
        spec = small_spec(dtype="float64", scale="none", mask_self=mask_self)
        params = fast.init_params(spec, rng)
        batch = random_batch(rng, spec, mask_fraction=0.0)
        _, cache = fast.forward(params, spec, batch)
        stats = fast.diagnostics(cache, batch)
        attn = cache["attn"]["attn"]  # (B, 1, T): the last position's row alone
        assert attn.shape == (B, 1, T)
        assert np.isclose(stats["self_attn"], attn[:, 0, T - 1].mean())
        if mask_self:
            assert stats["self_attn"] == 0.0 and np.all(cache["attn"]["scores"][..., T - 1] == -np.inf)
            assert np.allclose(attn.sum(-1), 1)
        else:
            assert stats["self_attn"] > 0


@pytest.mark.parametrize(
    "queries,causal,factored",
    [
        (np.array([T - 1]), False, True),
        (np.array([0]), True, True),
        (np.array([1, 3]), True, False),
        (slice(2, 4), False, False),
    ],
    ids=["last", "first-causal", "two-causal", "slice"],
)
def test_attention_at_some_queries_matches_finite_differences(rng, queries, causal, factored):
    """The head computed at a subset of query positions: out is those rows
    of the full head's, and the gradient of x, as factors (Factored, one
    query) or formed (two: at this size forming it costs less), equals
    finite differences."""
    x = rng.standard_normal((B, T, D))
    weights = {
        "W_q": rng.standard_normal((D, DK)) * 0.7,
        "W_k": rng.standard_normal((D, DK)) * 0.7,
        "W_v": rng.standard_normal((D, DV)),
        "W_o": rng.standard_normal((DV, D)),
    }
    s = head.score_scale("sqrt", DK)
    mask = head.causal_mask(T) if causal else None
    out, attn, cache = head.attention_forward(x, **weights, scale=s, mask=mask, queries=queries)
    full_out, full_attn, _ = head.attention_forward(x, **weights, scale=s, mask=mask)
    np.testing.assert_allclose(out, full_out[:, queries], rtol=1e-12)
    np.testing.assert_allclose(attn, full_attn[:, queries], rtol=1e-12)
    dout = rng.standard_normal(out.shape)
    analytic = head.attention_backward(dout, cache)
    assert isinstance(analytic["x"], pairs.Factored) == factored
    if factored:
        analytic["x"] = analytic["x"].dense()

    def f():
        return float((head.attention_forward(x, **weights, scale=s, mask=mask, queries=queries)[0] * dout).sum())

    report = gradcheck.check_gradients(f, {"x": x, **weights}, analytic)
    assert worst(report) < TOL, gradcheck.format_report(report)


def test_factored_gradients_reach_embeddings_as_the_formed_array_would(rng):
    """embedding_backward and add_at_positions give the same for
    Factored(L, R) as for the array L^T R it stands for."""
    left, right = rng.standard_normal((B, 2, T)), rng.standard_normal((B, 2, D))
    factored = pairs.Factored(left, right)
    dense = factored.dense()
    np.testing.assert_allclose(dense, np.einsum("brt,brd->btd", left, right), rtol=1e-12)
    positions, values = np.array([0, T - 1]), rng.standard_normal((B, 2, D))
    factored = pairs.add_at_positions(factored, positions, values)
    dense = pairs.add_at_positions(dense, positions, values)
    assert isinstance(factored, pairs.Factored) and factored.left.shape == (B, 4, T)
    np.testing.assert_allclose(factored.dense(), dense, rtol=1e-12)
    ids = np.stack([rng.integers(0, 4, (B, T)), np.broadcast_to(np.arange(T), (B, T))])  # a field (repeats), positions
    _, cache = pairs.embedding_forward(ids, [rng.standard_normal((4, D)), rng.standard_normal((T, D))])
    for from_factored, from_dense, expected in zip(
        pairs.embedding_backward(factored, cache), pairs.embedding_backward(dense, cache), (None, dense.sum(axis=0))
    ):
        np.testing.assert_allclose(from_factored, from_dense, rtol=1e-12, atol=1e-14)
        if expected is not None:  # the positions' table: every example's gradient summed
            np.testing.assert_allclose(from_factored, expected, rtol=1e-12, atol=1e-14)
