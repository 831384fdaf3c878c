"""The per-row mechanism measurements against brute force: each row's
gradient norms from the textbook model run on that row alone, and the
softmax Jacobian's norm under its bound."""

import numpy as np
import pytest

from attn.model import fast, mechanism, reference
from attn.model.fast import Batch, ModelSpec

B, T = 4, 5


def spec_of(**kw):
    return ModelSpec(
        **{
            **dict(
                fields=(("key", 5), ("value", 6)), n_positions=T, n_classes=5, d_model=6, d_k=7, d_v=3, dtype="float64"
            ),
            **kw,
        }
    )


@pytest.mark.parametrize(
    "variant",
    [
        dict(scale="sqrt"),
        dict(scale="none", qk_gain=3.0),
        dict(scale="sqrt", causal=True),
        dict(scale="none", mask_self=True),
        dict(scale="sqrt", score="qk_norm", qk_norm="rms", qk_norm_gain="vector"),
        dict(scale="none", score="qk_norm", qk_norm="layer", qk_norm_gain="vector", causal=True),
        dict(scale="none", score="qk_norm", qk_norm="rms", qk_norm_gain="scalar"),
        dict(scale="sqrt", score="qk_norm", qk_norm="rms", qk_norm_gain="none", mask_self=True),
        dict(scale="none", score="qk_norm", qk_norm="rms", qk_norm_gain="scalar", d_k=64, width_free=True),
    ],
    ids=[
        "sqrt",
        "none-saturating",
        "causal",
        "mask-self",
        "qk-norm-rms",
        "qk-norm-layer",
        "qk-norm-scalar",
        "qk-norm-none",
        "qk-norm-width-free",
    ],
)
@pytest.mark.parametrize("chunk", [mechanism.CHUNK_EXAMPLES, 3, 1], ids=lambda c: f"chunks-of-{c}")
def test_each_rows_gradient_norms_are_its_own_share_of_the_batch_gradient(variant, chunk, monkeypatch):
    """Also when the batch goes through in chunks of examples (of 3: uneven; of 1: one per example)."""
    monkeypatch.setattr(mechanism, "CHUNK_EXAMPLES", chunk)
    rng = np.random.default_rng(7)
    spec = spec_of(**variant)
    params = fast.init_params(spec, rng)
    for gain in ("g_q", "g_k"):  # qk_norm's gains start at 1: made unequal, so that each one's place is tested
        if gain in params:
            params[gain] = rng.uniform(0.5, 2.0, params[gain].shape)
    tokens = np.stack([rng.integers(0, v, (B, T)) for _, v in spec.fields], axis=-1)
    mask = rng.random((B, T)) < 0.5
    mask[:, -1] = True
    batch = Batch(tokens, rng.integers(0, 5, (B, T)), mask, -np.ones((B, T), int))
    rows = mechanism.row_statistics(params, spec, batch)
    n = mask.sum()
    for i, (b, t) in enumerate(zip(*np.nonzero(mask))):
        alone = np.zeros_like(mask)
        alone[b, t] = True
        _, grads, _ = reference.loss_and_grads(params, spec, Batch(tokens, batch.targets, alone, batch.target_key))
        np.testing.assert_allclose(rows["grad_W_q"][i], np.linalg.norm(grads["W_q"]) / n, rtol=1e-8, atol=1e-15)
        np.testing.assert_allclose(rows["grad_W_k"][i], np.linalg.norm(grads["W_k"]) / n, rtol=1e-8, atol=1e-15)
    assert np.all(rows["jacobian"] <= rows["bound"] + 1e-12)
    if variant.get("qk_gain") == 3.0:
        assert rows["saturated"].any(), "the unscaled head at gain 3 saturates some rows"


def test_summary_splits_saturated_rows_and_measures_concentration():
    rows = {
        "saturated": np.array([True, True, False, False]),
        "max_p": np.array([1.0, 0.999, 0.5, 0.3]),
        "grad_W_q": np.array([1e-9, 3e-9, 2.0, 4.0]),
        "grad_W_k": np.array([0.0, 0.0, 1.0, 1.0]),
        "jacobian": np.array([0.0, 0.001, 0.4, 0.5]),
        "bound": np.array([0.0, 0.002, 1.0, 1.4]),
    }
    out = mechanism.summary(rows)
    assert out["saturated_frac"] == 0.5
    assert out["grad_W_q_median_saturated"] == pytest.approx(2e-9) and out["grad_W_q_median_other"] == 3.0
    assert out["grad_W_q_top_share"] == pytest.approx(16 / (16 + 4 + 1e-18 + 9e-18))  # the top 10% of 4 rows: one
    assert out["jacobian_over_bound_max"] == 0.5
    assert np.isnan(mechanism.top_share(np.zeros(3)))


def _seed(outcome, initial_target, final_self):
    from types import SimpleNamespace

    return SimpleNamespace(
        outcome=SimpleNamespace(outcome=outcome),
        at_init={"target_attn": initial_target},
        at_end={"self_attn": final_self},
    )


def test_rank_auc_counts_pairs_and_ties():
    from attn.analysis.results import rank_auc

    assert rank_auc([0.01, 0.02], [0.1, 0.2, 0.3]) == 1.0
    assert rank_auc([0.5], [0.1, 0.9]) == 0.5
    assert rank_auc([0.1], [0.1]) == 0.5
    assert rank_auc([], [0.1]) is None


def test_stall_mechanism_counts_self_attending_ends_and_initial_target_attention():
    """Stalled runs that end attending to themselves against learned ones, and
    the initial attention on the right key of each class, with its AUC."""
    from attn import outcomes
    from attn.analysis import stats
    from attn.analysis.results import SELF_ATTENDING, stall_mechanism

    seeds = [
        _seed(outcomes.STALLED, 0.03, 0.97),
        _seed(outcomes.STALLED, 0.09, 0.95),
        _seed(outcomes.STALLED, 0.12, 0.5),
        _seed(outcomes.LEARNED, 0.11, 0.01),
        _seed(outcomes.LEARNED, 0.14, 0.02),
        _seed(outcomes.LEARNED, 0.13, None),
        _seed(outcomes.SLOW, 0.01, 0.99),
    ]
    out = stall_mechanism(seeds)
    assert out["stalled"]["n"] == 3 and out["learned"]["n"] == 3
    ends = out["stalled"]["self_attending"]
    assert (ends["k"], ends["n"]) == (2, 3) and (ends["low"], ends["high"]) == stats.wilson_interval(2, 3)
    assert (
        out["learned"]["self_attending"]["k"] == 0 and out["learned"]["self_attending"]["n"] == 2
    )  # one without a value
    initial = out["stalled"]["initial_target_attn"]
    assert (initial["median"], initial["min"], initial["max"]) == (0.09, 0.03, 0.12)
    assert out["auc"] == (3 + 3 + 2) / 9  # 0.12 is above 0.11 alone
    assert SELF_ATTENDING == 0.9
    empty = stall_mechanism([])
    assert empty["auc"] is None and empty["stalled"]["initial_target_attn"]["median"] is None


def test_a_float32_models_saturated_rows_keep_the_jacobian_under_its_bound():
    """A float32 row sums to 1 only to about 1e-7, as large as a saturated row's bound 2 (1 - max_p):
    the rows are renormalised in float64 before either is computed."""
    rng = np.random.default_rng(3)
    spec = spec_of(dtype="float32", scale="none", qk_gain=4.0, d_k=64, d_model=16)
    params = fast.init_params(spec, rng)
    tokens = np.stack([rng.integers(0, v, (64, T)) for _, v in spec.fields], axis=-1)
    mask = np.zeros((64, T), dtype=bool)
    mask[:, -1] = True
    batch = Batch(tokens, rng.integers(0, 5, (64, T)), mask, -np.ones((64, T), int))
    rows = mechanism.row_statistics(params, spec, batch)
    assert (rows["max_p"] > 1 - 1e-6).sum() >= 5, "rows saturated to float32's last digits"
    assert np.all(rows["jacobian"] <= rows["bound"] * (1 + 1e-9) + 1e-300)
