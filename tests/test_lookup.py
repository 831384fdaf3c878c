"""X through its embedding tables (attn.model.pairs.LazyEmbeddings): the same numbers as X formed."""

import numpy as np
import pytest

from attn.model import fast, gradcheck, head, pairs
from attn.model.fast import Batch, ModelSpec

B, T, D = 4, 7, 6  # T != D; three sources: two fields and the positions


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def embedded(rng, members=(), shared_positions=False):
    """A LazyEmbeddings X (*members, B, T, D) of two fields (5 and 6 ids, repeats
    likely) and positions, float64; the positions' table shared by the members when asked."""
    tables = [
        rng.standard_normal((*members, 5, D)),
        rng.standard_normal((*members, 6, D)),
        rng.standard_normal((T, D) if shared_positions else (*members, T, D)),
    ]
    ids = np.stack(
        [
            rng.integers(0, 5, (*members, B, T)),
            rng.integers(0, 6, (*members, B, T)),
            np.broadcast_to(np.arange(T), (*members, B, T)),
        ]
    )
    x, _ = pairs.embedding_forward(ids, tables)
    formed = sum(
        np.take_along_axis(
            table if table.ndim == len(members) + 2 else np.broadcast_to(table, (*members, *table.shape)),
            i.reshape(*members, B * T, 1),
            axis=-2,
        ).reshape(*members, B, T, D)
        for table, i in zip(tables, ids)
    )
    return x, formed


@pytest.mark.parametrize("members", [(), (3,)])
@pytest.mark.parametrize("P", [1, 2])
def test_products_through_the_tables_equal_those_with_x_formed(rng, members, P):
    x, formed = embedded(rng, members, shared_positions=bool(members))
    assert x.shape == formed.shape
    np.testing.assert_allclose(x.dense(), formed, rtol=1e-13, atol=1e-13)
    positions = np.array([T - 1, 2][:P])
    np.testing.assert_allclose(x.rows(positions), formed[..., positions, :], rtol=1e-13, atol=1e-13)
    y = rng.standard_normal((*members, B, P, D))
    weights = rng.standard_normal((*members, B, P, T))
    scores = x.key_major_product(y)
    np.testing.assert_allclose(scores, y @ formed.swapaxes(-1, -2), rtol=1e-12, atol=1e-12)
    assert np.moveaxis(scores, -1, 0).flags.c_contiguous, "keys outermost, as the softmax reads them"
    np.testing.assert_allclose(x.weighted_sum(weights), weights @ formed, rtol=1e-12, atol=1e-12)


def test_float32_products_stay_float32(rng):
    tables = [rng.standard_normal((5, D), dtype=np.float32), rng.standard_normal((T, D), dtype=np.float32)]
    ids = np.stack([rng.integers(0, 5, (B, T)), np.broadcast_to(np.arange(T), (B, T))])
    x, _ = pairs.embedding_forward(ids, tables)
    y, weights = rng.standard_normal((B, 1, D), dtype=np.float32), rng.random((B, 1, T), dtype=np.float32)
    assert x.key_major_product(y).dtype == x.weighted_sum(weights).dtype == x.dense().dtype == np.float32


def retrieval_spec(**kw) -> ModelSpec:
    base = dict(fields=(("key", 5), ("value", 6)), n_positions=T, n_classes=5, d_model=D, d_k=9, d_v=4, dtype="float64")
    return ModelSpec(**{**base, **kw})


def query_batch(rng, spec, members=()) -> Batch:
    """Retrieval's shape: one query, the last position, carries the loss."""
    shape = (*members, B, T)
    tokens = np.stack([rng.integers(0, v, shape) for _, v in spec.fields], axis=-1)
    mask = np.zeros(shape, bool)
    mask[..., -1] = True
    return Batch(
        tokens, rng.integers(0, spec.n_classes, shape), mask, np.where(mask, rng.integers(0, T - 1, shape), -1)
    )


VARIANTS = [
    dict(scale="sqrt"),
    dict(scale="none", mask_self=True),
    dict(scale="sqrt", causal=True),
    dict(scale="sqrt", positional="sinusoidal"),
    dict(scale="sqrt", positional="none", residual=False),
    dict(score="softcap", scale="none"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_the_model_is_the_same_with_x_formed_or_looked_up(rng, variant):
    """Loss and every gradient, forward and backward through the bilinear
    head, alike to 1e-12 (float64) for one model and a stack of two."""
    for members in ((), (2,)):
        spec = retrieval_spec(**variant)
        params = fast.init_params(spec, rng)
        if members:
            params = {name: np.stack([p, fast.init_params(spec, rng)[name]]) for name, p in params.items()}
        batch = query_batch(rng, spec, members)
        results = {}
        for lookup in (False, True):
            loss, cache = fast.forward(params, spec, batch, association="bilinear", lookup=lookup)
            assert isinstance(cache["attn"]["x"], pairs.LazyEmbeddings) == lookup
            results[lookup] = loss, fast.backward(cache, spec)
        np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-12)
        for name, grad in results[False][1].items():
            np.testing.assert_allclose(results[True][1][name], grad, rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("variant", VARIANTS[:3], ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_gradients_through_the_tables_match_finite_differences(rng, variant):
    spec = retrieval_spec(**variant)
    params = fast.init_params(spec, rng)
    batch = query_batch(rng, spec)

    def loss_and_grads(p):
        loss, cache = forward(p)
        return loss, fast.backward(cache, spec)

    def forward(p):
        return fast.forward(p, spec, batch, association="bilinear", lookup=True)

    report = gradcheck.check_model(params, loss_and_grads, loss=lambda p: forward(p)[0])
    assert max(r.rel_error for r in report.values()) < 1e-6, gradcheck.format_report(report)


@pytest.mark.parametrize(
    "change, looked_up",
    [
        ({}, True),  # retrieval: 18 table rows for 7 positions, one query
        ({"fields": (("key", 400), ("value", 6))}, False),  # a vocabulary far larger than the positions
        ({"score": "qk_norm"}, False),  # a norm of q and k forms X: every key's own norm is needed
    ],
)
def test_the_rule_takes_the_tables_when_cheaper(rng, change, looked_up):
    spec = retrieval_spec(**change)
    _, cache = fast.forward(fast.init_params(spec, rng), spec, query_batch(rng, spec))
    assert isinstance(cache["attn"]["x"], pairs.LazyEmbeddings) == looked_up


def test_a_query_at_every_position_forms_x(rng):
    spec = retrieval_spec()
    batch = query_batch(rng, spec)
    _, cache = fast.forward(fast.init_params(spec, rng), spec, batch, all_queries=True)
    assert isinstance(cache["attn"]["x"], np.ndarray)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_each_member_of_a_stack_is_its_model_alone_bit_for_bit_through_the_tables(rng, positional):
    """float32, as training runs: the stack's sums over sources and bins keep each member's order."""
    spec = retrieval_spec(dtype="float32", positional=positional)
    members = [fast.init_params(spec, rng) for _ in range(3)]
    stacked = {name: np.stack([m[name] for m in members]) for name in members[0]}
    batch = query_batch(rng, spec, (3,))
    loss, cache = fast.forward(stacked, spec, batch, association="bilinear")
    assert isinstance(cache["attn"]["x"], pairs.LazyEmbeddings)
    grads = fast.backward(cache, spec)
    for m, params in enumerate(members):
        alone = Batch(*(getattr(batch, f)[m] for f in ("tokens", "targets", "target_mask", "target_key")))
        loss_m, cache_m = fast.forward(params, spec, alone, association="bilinear")
        assert loss_m.dtype == np.float32 and np.array_equal(loss[m], loss_m)
        for name, grad in fast.backward(cache_m, spec).items():
            assert grad.dtype == np.float32 and np.array_equal(grads[name][m], grad), name


def test_queries_as_a_slice_of_some_positions_are_looked_up_alike(rng):
    """The head's queries as a slice (not an index array) of fewer than T / 3 positions."""
    spec = retrieval_spec(n_positions=12)
    params = fast.init_params(spec, rng)
    ids = np.stack([rng.integers(0, 5, (B, 12)), rng.integers(0, 6, (B, 12)), np.broadcast_to(np.arange(12), (B, 12))])
    x, _ = pairs.embedding_forward(ids, [params["E_key"], params["E_value"], params["E_pos"]])
    upstream = rng.standard_normal((B, 3, D))
    outputs = {}
    for lookup in (False, True):
        out, attn, cache = head.attention_forward(
            x,
            params["W_q"],
            params["W_k"],
            params["W_v"],
            params["W_o"],
            spec.score_scale,
            queries=slice(9, 12),
            association="bilinear",
            lookup=lookup,
        )
        assert isinstance(cache["x"], pairs.LazyEmbeddings) == lookup and out.shape == (B, 3, D)
        outputs[lookup] = out, head.attention_backward(upstream, cache)
    np.testing.assert_allclose(outputs[True][0], outputs[False][0], rtol=1e-12)
    for name in ("W_q", "W_k", "W_v", "W_o"):
        np.testing.assert_allclose(outputs[True][1][name], outputs[False][1][name], rtol=1e-12, err_msg=name)


def test_the_rule_flips_where_its_count_does():
    """lookup_is_cheaper against the counts it states, on both sides of the flip and at the keep_factored gate."""
    S, T, P, D = 3, 9, 1, 64
    flip = max(V for V in range(1, 1000) if pairs.lookup_is_cheaper(S, T, V, P, D))
    assert 4 * P * flip * D + pairs.MOVE_COST * 4 * S * P * T <= pairs.MOVE_COST * (S + 4 * P) * T * D
    assert 4 * P * (flip + 1) * D + pairs.MOVE_COST * 4 * S * P * T > pairs.MOVE_COST * (S + 4 * P) * T * D
    assert pairs.lookup_is_cheaper(S, 7, 10, 2, D) and not pairs.lookup_is_cheaper(S, 6, 10, 2, D), "3 P < T"


@pytest.mark.parametrize("members", [(), (3,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_positional_source_is_binned_as_the_weights_themselves(rng, members, dtype):
    """The positions' bins are not counted but copied (pairs._binned's
    positions_from): bit for bit the bins counted over every source, in the
    products and in the embeddings' gradient, with the positions' table larger than T too."""
    sizes = (5, 6, T + 2)
    tables = [rng.standard_normal((*members, V, D)).astype(dtype) for V in sizes]
    ids = np.stack(
        [
            rng.integers(0, 5, (*members, B, T)),
            rng.integers(0, 6, (*members, B, T)),
            np.broadcast_to(np.arange(T), (*members, B, T)),
        ]
    )
    counted, counted_cache = pairs.embedding_forward(ids, tables)
    copied, copied_cache = pairs.embedding_forward(ids, tables, positional=True)
    assert counted.positions_from is None and copied.positions_from == 11
    weights = rng.standard_normal((*members, B, 2, T)).astype(dtype)
    np.testing.assert_array_equal(copied.weighted_sum(weights), counted.weighted_sum(weights))
    dx = pairs.Factored(
        rng.standard_normal((*members, B, 3, T)).astype(dtype), rng.standard_normal((*members, B, 3, D)).astype(dtype)
    )
    for by_copy, by_count in zip(
        pairs.embedding_backward(dx, copied_cache), pairs.embedding_backward(dx, counted_cache)
    ):
        np.testing.assert_array_equal(by_copy, by_count)
