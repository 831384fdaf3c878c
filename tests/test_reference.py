"""The textbook model (attn.model.reference) against finite differences, and every
fast path of attn.model.fast and attn.model.head against the textbook model.

Fast and textbook are compared in float64 at 1e-12, relative to the largest
entry of each array (max |fast - textbook| <= 1e-12 max |textbook|): the two
differ only in the order of their sums, which moves the last few bits of an
entry, not a digit of the result.
"""

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

from attn.model import fast, gradcheck, head, pairs, reference
from attn.model.fast import Batch, ModelSpec

B, T, D, DK, DV = 3, 5, 6, 3, 4  # the gradient tests' shapes: T != d_k, odd d_k, d_v != d_k
WIDE_DK = 7  # d_k > d_model: the bilinear head merges W_q W_k^T into one D x D matrix
AGREE = 1e-12
ASSOCIATIONS = ("projected", "bilinear")


def close(fast, textbook) -> bool:
    fast, textbook = np.asarray(fast, dtype=np.float64), np.asarray(textbook, dtype=np.float64)
    return np.abs(fast - textbook).max() <= AGREE * max(np.abs(textbook).max(), 1e-300)


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def spec_of(**kw) -> ModelSpec:
    base = dict(
        fields=(("key", 5), ("value", 6)), n_positions=T, n_classes=5, d_model=D, d_k=DK, d_v=DV, dtype="float64"
    )
    return ModelSpec(**{**base, **kw})


def batch_of(rng, spec: ModelSpec, where: str, members: tuple = ()) -> Batch:
    """Targets at every position, at some, or at the last only (retrieval's shape)."""
    shape = (*members, B, T)
    tokens = np.stack([rng.integers(0, v, shape) for _, v in spec.fields], axis=-1)
    mask = {"every": np.ones(shape, bool), "some": rng.random(shape) < 0.5, "last": np.zeros(shape, bool)}[where]
    mask[..., -1] = True
    return Batch(tokens, rng.integers(0, spec.n_classes, shape), mask, np.where(mask, rng.integers(0, T, shape), -1))


VARIANTS = [
    dict(scale="sqrt"),
    dict(scale="none", causal=True),
    dict(scale="linear", residual=False),
    dict(scale="sqrt", positional="sinusoidal"),
    dict(scale="sqrt", positional="none"),
    dict(scale="none", d_k=WIDE_DK),
    dict(scale="sqrt", fields=(("token", 7),), n_classes=7, qk_gain=2.0, causal=True),
    dict(scale="none", mask_self=True),
    dict(scale="sqrt", mask_self=True, d_k=WIDE_DK),
]


def variant_id(v: dict) -> str:
    return ",".join(f"{k}={v[k]}" for k in v if k != "fields") + (",copy" if "fields" in v else "")


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_textbook_gradients_match_finite_differences(rng, variant):
    spec = spec_of(**variant)
    params = fast.init_params(spec, rng)
    batch = batch_of(rng, spec, "some")
    report = gradcheck.check_model(
        params, lambda p: reference.loss_and_grads(p, spec, batch), loss=lambda p: reference.forward(p, spec, batch)[0]
    )
    assert max(r.rel_error for r in report.values()) < 1e-6, gradcheck.format_report(report)


@pytest.mark.parametrize(
    "variant,where,association",
    list(itertools.product(VARIANTS, ("every", "some", "last"), ASSOCIATIONS)),
    ids=lambda v: variant_id(v) if isinstance(v, dict) else v,
)
def test_fast_model_equals_the_textbook(rng, variant, where, association):
    """Loss, every gradient, and the scores and attention rows the diagnostics read."""
    spec = spec_of(**variant)
    params = fast.init_params(spec, rng)
    batch = batch_of(rng, spec, where)
    loss, cache = fast.forward(params, spec, batch, association=association)
    grads = fast.backward(cache, spec)
    assert cache["attn"]["association"] == association
    ref_loss, ref_grads, ref_cache = reference.loss_and_grads(params, spec, batch)
    assert close(loss, ref_loss)
    for name in ref_grads:
        assert close(grads[name], ref_grads[name]), name
    rows = cache["positions"]
    assert close(cache["attn"]["attn"], ref_cache["A"][:, rows])
    finite = np.isfinite(ref_cache["scores"][:, rows])
    assert np.array_equal(np.isfinite(cache["attn"]["scores"]), finite)
    assert close(cache["attn"]["scores"][finite], ref_cache["scores"][:, rows][finite])
    own = np.arange(T)[rows]  # the diagnostics' self_attn is the textbook A's diagonal at the target rows
    on_self = ref_cache["A"][:, own, own] if isinstance(rows, np.ndarray) else np.diagonal(ref_cache["A"], 0, 1, 2)
    kept = batch.target_mask[:, rows]
    assert np.isclose(fast.diagnostics(cache, batch)["self_attn"], on_self[kept].mean(), rtol=1e-12, atol=1e-15)
    if spec.mask_self:
        assert np.all(on_self == 0)


@pytest.mark.parametrize("association", ASSOCIATIONS)
@pytest.mark.parametrize("where", ("every", "last"))
def test_a_stack_of_members_equals_each_member_alone(rng, association, where):
    """Three models of one shape with their own parameters, batches and score
    scales, as one stacked computation: each member's loss, gradients and
    diagnostics are its textbook model's."""
    specs = [spec_of(scale=s, d_k=WIDE_DK) for s in ("sqrt", "none", "linear")]
    members = [fast.init_params(spec, rng) for spec in specs]
    stacked = {name: np.stack([p[name] for p in members]) for name in members[0]}
    batch = batch_of(rng, specs[0], where, members=(3,))
    scales = np.array([spec.score_scale for spec in specs])
    loss, cache = fast.forward(stacked, specs[0], batch, scale=scales, association=association)
    grads = fast.backward(cache, specs[0])
    stats = fast.diagnostics(cache, batch)
    assert loss.shape == (3,) and all(g.shape[0] == 3 for g in grads.values())
    for m, spec in enumerate(specs):
        alone = Batch(*(getattr(batch, f)[m] for f in ("tokens", "targets", "target_mask", "target_key")))
        ref_loss, ref_grads, _ = reference.loss_and_grads(members[m], spec, alone)
        assert close(loss[m], ref_loss)
        for name in ref_grads:
            assert close(grads[name][m], ref_grads[name]), (m, name)
        _, solo_cache = fast.forward(members[m], spec, alone, association=association)
        for key, value in fast.diagnostics(solo_cache, alone).items():
            assert np.isclose(stats[key][m], value, rtol=1e-12, atol=1e-15), (m, key)


@pytest.mark.parametrize("members", [(), (2,)], ids=["one model", "two members"])
@pytest.mark.parametrize(
    "association,d_k,causal,queries",
    [
        ("projected", DK, False, slice(None)),
        ("projected", DK, True, np.array([T - 1])),
        ("bilinear", DK, False, slice(None)),
        ("bilinear", DK, True, np.array([1, 3])),
        ("bilinear", WIDE_DK, False, np.array([T - 1])),
        ("bilinear", WIDE_DK, True, slice(None)),
    ],
    ids=lambda v: str(v) if not isinstance(v, np.ndarray) else f"queries{v.tolist()}",
)
def test_each_association_of_the_head_matches_finite_differences(rng, members, association, d_k, causal, queries):
    x = rng.standard_normal((*members, B, T, D))
    gain = 0.5 * np.sqrt(DK / d_k)  # scores of the same spread at either width: no row saturates
    weights = {
        "W_q": rng.standard_normal((*members, D, d_k)) * gain,
        "W_k": rng.standard_normal((*members, D, d_k)) * gain,
        "W_v": rng.standard_normal((*members, D, DV)),
        "W_o": rng.standard_normal((*members, DV, D)),
    }
    scale = rng.uniform(0.3, 1.0, members) if members else 0.6
    mask = head.causal_mask(T) if causal else None
    out, _, cache = head.attention_forward(
        x, **weights, scale=scale, mask=mask, queries=queries, association=association
    )
    dout = rng.standard_normal(out.shape)
    analytic = head.attention_backward(dout, cache)
    if isinstance(analytic["x"], pairs.Factored):
        analytic["x"] = analytic["x"].dense()

    def f():
        return float(
            (
                head.attention_forward(x, **weights, scale=scale, mask=mask, queries=queries, association=association)[
                    0
                ]
                * dout
            ).sum()
        )

    report = gradcheck.check_gradients(f, {"x": x, **weights}, analytic)
    assert max(r.rel_error for r in report.values()) < 1e-6, gradcheck.format_report(report)


@pytest.mark.parametrize("merged", (False, True))
def test_factorised_linear_matches_finite_differences_either_way(rng, merged):
    x, U, V = rng.standard_normal((B, T, D)), rng.standard_normal((D, DK)), rng.standard_normal((DK, DV))
    dout = rng.standard_normal((B, T, DV))
    out, cache = pairs.factorised_linear_forward(x, U, V, merged=merged)
    assert close(out, x @ U @ V)
    dx, dU, dV = pairs.factorised_linear_backward(dout, cache)
    report = gradcheck.check_gradients(
        lambda: float((pairs.factorised_linear_forward(x, U, V, merged=merged)[0] * dout).sum()),
        {"x": x, "U": U, "V": V},
        {"x": dx, "U": dU, "V": dV},
    )
    assert max(r.rel_error for r in report.values()) < 1e-6, gradcheck.format_report(report)


def test_the_association_rule_follows_the_cost_model():
    """One query row (retrieval) or d_k above d_model: bilinear; a query at
    every position with narrow heads (copy): projected; and the rule picks
    the smaller of the two counts it documents."""
    assert head.choose_association(64, 1, 9, 64, 32, 32) == "bilinear"
    assert head.choose_association(64, 8, 8, 64, 32, 32) == "projected"
    assert head.choose_association(64, 8, 8, 64, 1024, 32) == "bilinear"
    for shape in itertools.product((8, 64), (1, 8), (9,), (16, 64), (8, 256), (8, 32)):
        costs = head.head_costs(*shape)
        assert head.choose_association(*shape) == min(costs, key=lambda k: (costs[k], k != "projected"))
    assert pairs.merge_is_cheaper(64, 64, 4096, 64) and not pairs.merge_is_cheaper(64, 64, 16, 64)


def test_float32_stays_float32_through_a_stack(rng):
    spec = spec_of(dtype="float32", d_k=WIDE_DK)
    members = [fast.init_params(spec, rng) for _ in range(2)]
    stacked = {name: np.stack([p[name] for p in members]) for name in members[0]}
    batch = batch_of(rng, spec, "last", members=(2,))
    for association in ASSOCIATIONS:
        loss, cache = fast.forward(stacked, spec, batch, scale=np.array([0.5, 1.0]), association=association)
        grads = fast.backward(cache, spec)
        assert loss.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())


@pytest.mark.parametrize("junk", (-1, 5, 10**6))
def test_targets_where_there_is_none_may_hold_any_value(rng, junk):
    """Batch: `targets` holds any value where target_mask is false; both models ignore it, out of range or not."""
    spec = spec_of()
    params = fast.init_params(spec, rng)
    batch = batch_of(rng, spec, "some")
    junked = Batch(batch.tokens, np.where(batch.target_mask, batch.targets, junk), batch.target_mask, batch.target_key)
    loss, grads, _ = reference.loss_and_grads(params, spec, batch)
    junk_loss, junk_grads, _ = reference.loss_and_grads(params, spec, junked)
    fast_loss, fast_grads, _ = fast.loss_and_grads(params, spec, junked)
    assert junk_loss == loss and close(fast_loss, junk_loss)
    for name in grads:
        assert np.array_equal(junk_grads[name], grads[name]), name
        assert close(fast_grads[name], junk_grads[name]), name


def test_the_textbook_model_imports_nothing_of_attn():
    """The yardstick is independent of what it checks: numpy and the standard library only."""
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert [name for name in imported if name.split(".")[0] == "attn"] == []
