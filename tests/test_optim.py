"""The optimisers against the update rules of attn/optim.py's docstring,
recomputed here in float64 without in-place arithmetic; gradient clipping;
the learning-rate schedule."""

import math

import numpy as np
import pytest

from attn import optim

SHAPES = {"W_q": (3, 4), "b_out": (5,)}
LR_MULT = {"W_q": 0.25}
LRS = [0.3, 0.2, 0.1, 0.05]  # one learning rate per step, as a schedule would give


def random_problem(dtype, seed: int = 0):
    """Initial parameters and one random gradient per step."""
    rng = np.random.default_rng(seed)
    params = {n: rng.standard_normal(s).astype(dtype) for n, s in SHAPES.items()}
    grads = [{n: rng.standard_normal(s).astype(dtype) for n, s in SHAPES.items()} for _ in LRS]
    return params, grads


def reference_sgd(w, grads, lrs, momentum=0.0, nesterov=False, weight_decay=0.0):
    """The docstring's SGD: g = grad + wd w; b = mu b + g; step along b, or g + mu b (Nesterov)."""
    buf = np.zeros_like(w)
    for grad, lr in zip(grads, lrs):
        g = grad + weight_decay * w
        buf = momentum * buf + g
        w = w - lr * ((g + momentum * buf) if nesterov else buf)
    return w


def reference_adam(w, grads, lrs, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False):
    """The docstring's Adam (L2 decay in the gradient) or AdamW (decay applied to w first)."""
    m = v = np.zeros_like(w)
    for t, (grad, lr) in enumerate(zip(grads, lrs), start=1):
        if decoupled:
            w = w - lr * weight_decay * w
            g = grad
        else:
            g = grad + weight_decay * w
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        w = w - lr * (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps)
    return w


CASES = {
    "sgd": (optim.SGD, reference_sgd, {}),
    "sgd-weight-decay": (optim.SGD, reference_sgd, dict(weight_decay=0.1)),
    "heavy-ball": (optim.SGD, reference_sgd, dict(momentum=0.9)),
    "nesterov": (optim.SGD, reference_sgd, dict(momentum=0.9, nesterov=True)),
    "nesterov-weight-decay": (optim.SGD, reference_sgd, dict(momentum=0.5, nesterov=True, weight_decay=0.2)),
    "adam": (optim.Adam, reference_adam, {}),
    "adam-l2": (optim.Adam, reference_adam, dict(beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1)),
    "adamw": (optim.Adam, reference_adam, dict(weight_decay=0.1, decoupled=True)),
}


def run_optimizer(case: str, dtype):
    """(parameters after len(LRS) steps, their float64 reference, the optimiser, its gradients)."""
    cls, reference, hyper = CASES[case]
    params, grads = random_problem(dtype)
    expected = {
        n: reference(
            params[n].astype(np.float64),
            [g[n].astype(np.float64) for g in grads],
            [lr * LR_MULT.get(n, 1.0) for lr in LRS],
            **hyper,
        )
        for n in params
    }
    optimizer = cls(params, lr_mult=LR_MULT, **hyper)
    for step_grads, lr in zip(grads, LRS):
        optimizer.step(params, step_grads, lr)
    return params, expected, optimizer, grads


@pytest.mark.parametrize("case", CASES)
def test_update_matches_the_docstring_formula_in_float64(case):
    params, expected, _, _ = run_optimizer(case, np.float64)
    for name in params:
        np.testing.assert_allclose(params[name], expected[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("case", CASES)
def test_float32_stays_float32_and_tracks_the_float64_formula(case):
    params, expected, optimizer, grads = run_optimizer(case, np.float32)
    for name in params:
        assert params[name].dtype == np.float32, name
        np.testing.assert_allclose(params[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for key, state in optimizer.state.items():
        assert state.dtype == (np.int64 if key == "t" else np.float32), key
    assert all(g.dtype == np.float32 for step in grads for g in step.values())


@pytest.mark.parametrize("case", CASES)
def test_step_updates_params_in_place_and_leaves_grads_alone(case):
    cls, _, hyper = CASES[case]
    params, grads = random_problem(np.float64)
    arrays = dict(params)
    grads_before = {n: g.copy() for n, g in grads[0].items()}
    cls(params, **hyper).step(params, grads[0], 0.1)
    for name in params:
        assert params[name] is arrays[name]
        assert np.array_equal(grads[0][name], grads_before[name])


@pytest.mark.parametrize("case", CASES)
def test_a_stack_that_loses_a_member_steps_each_as_alone(case):
    """The update's temporaries follow the weights' shape: three members
    stepped as a stack, then two of them after the third left (as
    attn.train.stack.Stack keeps its members' rows), equal each stepped alone."""
    cls, _, hyper = CASES[case]
    members = [random_problem(np.float32, seed) for seed in range(3)]
    alone = []
    for params, grads in members:
        params = {n: w.copy() for n, w in params.items()}
        optimizer = cls(params, **hyper)
        for step_grads, lr in zip(grads, LRS):
            optimizer.step(params, step_grads, lr)
        alone.append(params)
    stacked = {n: np.stack([params[n] for params, _ in members]) for n in SHAPES}
    optimizer = cls(stacked, **hyper)
    for step, lr in enumerate(LRS):
        if step == 2:  # the third member leaves
            stacked = {n: w[:2].copy() for n, w in stacked.items()}
            optimizer.state = {k: v[:2] if v.ndim else v for k, v in optimizer.state.items()}
        kept = 3 if step < 2 else 2
        optimizer.step(stacked, {n: np.stack([grads[step][n] for _, grads in members[:kept]]) for n in SHAPES}, lr)
    for m in range(2):
        assert all(np.array_equal(stacked[n][m], alone[m][n]) for n in SHAPES), m


def test_lr_mult_scales_the_step_of_its_parameter_only():
    params, grads = random_problem(np.float64)
    start = {n: p.copy() for n, p in params.items()}
    plain = {n: p.copy() for n, p in params.items()}
    optim.SGD(params, lr_mult={"W_q": 0.1}).step(params, grads[0], 0.5)
    optim.SGD(plain).step(plain, grads[0], 0.5)
    np.testing.assert_allclose(params["W_q"] - start["W_q"], 0.1 * (plain["W_q"] - start["W_q"]), rtol=1e-12)
    assert np.array_equal(params["b_out"], plain["b_out"])


# ---------------------------------------------------------------------------
# Gradient clipping
# ---------------------------------------------------------------------------
def norm_float64(grads) -> float:
    return float(np.linalg.norm(np.concatenate([g.astype(np.float64).ravel() for g in grads.values()])))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-6)])
def test_clip_scales_all_grads_to_max_norm(dtype, rtol):
    _, (grads, *_) = random_problem(dtype)
    original = {n: g.astype(np.float64) for n, g in grads.items()}
    arrays = dict(grads)
    norm = norm_float64(grads)
    max_norm = norm / 7
    assert optim.clip_by_global_norm(grads, max_norm) == pytest.approx(norm, rel=rtol)
    assert norm_float64(grads) == pytest.approx(max_norm, rel=rtol)
    for name, g in grads.items():
        assert g is arrays[name] and g.dtype == dtype
        np.testing.assert_allclose(g, original[name] * (max_norm / norm), rtol=rtol)


@pytest.mark.parametrize("factor", [1.0, 1.0001, 3.0])
def test_clip_leaves_grads_at_or_below_max_norm_untouched(factor):
    _, (grads, *_) = random_problem(np.float64)
    before = {n: g.copy() for n, g in grads.items()}
    norm = optim.global_norm(grads)
    assert optim.clip_by_global_norm(grads, norm * factor) == norm
    assert all(np.array_equal(grads[n], before[n]) for n in grads)


def test_global_norm_of_float32_grads_is_accumulated_in_float64():
    huge = {"W_q": np.full((4, 5), 1e20, dtype=np.float32), "b_out": np.full(3, -2e20, dtype=np.float32)}
    assert optim.global_norm(huge) == pytest.approx(norm_float64(huge), rel=1e-12)
    many = {"W": np.random.default_rng(0).standard_normal(10**5).astype(np.float32)}
    assert optim.global_norm(many) == pytest.approx(norm_float64(many), rel=1e-12)


# ---------------------------------------------------------------------------
# Learning-rate schedule
# ---------------------------------------------------------------------------
BASE_LR, TOTAL = 0.4, 100


def lrs(schedule: str, warmup: int, min_lr_ratio: float = 0.0, total: int = TOTAL) -> np.ndarray:
    return np.array(
        [optim.learning_rate(step, BASE_LR, schedule, warmup, total, min_lr_ratio) for step in range(total + 1)]
    )


def test_constant_schedule_is_the_base_lr():
    assert np.all(lrs("constant", 0) == BASE_LR)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_warmup_is_linear_from_lr_over_warmup_to_lr(schedule):
    warmup = 8
    schedule_lrs = lrs(schedule, warmup)
    np.testing.assert_allclose(schedule_lrs[:warmup], BASE_LR * np.arange(1, warmup + 1) / warmup, rtol=1e-15)
    assert schedule_lrs[0] == pytest.approx(BASE_LR / warmup) and schedule_lrs[warmup - 1] == BASE_LR
    assert schedule_lrs[warmup] == BASE_LR


@pytest.mark.parametrize("warmup, min_lr_ratio", [(0, 0.0), (10, 0.0), (10, 0.2), (0, 1.0)])
def test_cosine_endpoints_and_midpoint(warmup, min_lr_ratio):
    schedule_lrs = lrs("cosine", warmup, min_lr_ratio)
    floor = min_lr_ratio * BASE_LR
    assert schedule_lrs[warmup] == pytest.approx(BASE_LR)
    assert schedule_lrs[TOTAL] == pytest.approx(floor, abs=1e-15)
    midpoint = warmup + (TOTAL - warmup) // 2
    assert (TOTAL - warmup) % 2 == 0
    assert schedule_lrs[midpoint] == pytest.approx((BASE_LR + floor) / 2)
    assert np.all(np.diff(schedule_lrs[warmup:]) <= 1e-15), "cosine decay never increases"
    assert np.all(schedule_lrs[warmup:] >= floor - 1e-15)
    assert optim.learning_rate(TOTAL + 50, BASE_LR, "cosine", warmup, TOTAL, min_lr_ratio) == pytest.approx(floor)


def test_cosine_is_symmetric_about_its_midpoint():
    schedule_lrs = lrs("cosine", 0, 0.1)
    floor, quarter = 0.1 * BASE_LR, TOTAL // 4
    assert schedule_lrs[quarter] - (BASE_LR + floor) / 2 == pytest.approx(
        (BASE_LR + floor) / 2 - schedule_lrs[3 * quarter]
    )
    assert schedule_lrs[quarter] == pytest.approx(floor + (BASE_LR - floor) * (1 + math.cos(math.pi / 4)) / 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_stacks_squared_norms_are_each_members_own_bit_for_bit(dtype):
    """Each member's figure is squared_norm of its slice alone, for a stack
    laid out as its members' weights are (C order, or transposed as W_k^T)."""
    rng = np.random.default_rng(3)
    stack = (rng.standard_normal((5, 37, 29)) * 10.0 ** rng.integers(-3, 4, (5, 1, 1))).astype(dtype)
    for a in (stack, stack.swapaxes(-1, -2)):
        before = a.copy()
        together = optim.squared_norms(a)
        alone = np.array([optim.squared_norm(np.ascontiguousarray(member)) for member in a])
        assert together.dtype == np.float64 and together.shape == (5,)
        np.testing.assert_array_equal(together, alone)
        np.testing.assert_array_equal(a, before)
