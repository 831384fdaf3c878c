"""attn's model written in PyTorch and JAX: the rivals `make bench` times.

One formulation of the loss, written once over a small table of array
operations (OPS) so that PyTorch and JAX compute exactly the same thing:

    X = sum_f E_f[tokens_f] + P[:T];  X_Q = X at the query positions
    projected   S = s (X_Q W_q) (X W_k)^T,         out = (A (X W_v)) W_o
    bilinear    S = (X_Q W_QK) X^T,                out = (A X) W_OV
                (W_QK = s W_q W_k^T and W_OV = W_v W_o applied as two
                products or one, as attn.model.pairs.merge_is_cheaper decides)
    loss = mean over target positions of -log softmax(H W_out + b)[target]

with the query side at the positions where some example has a target
(retrieval: the query; copy: every position), the algorithm attn runs;
`positions` = every position gives the textbook model (the twin of
tests/test_torch_reference.py). Autograd does the backward; the update is
plain SGD, as in attn's step. Each rival is `stepper(...) -> step()`, one
training step on the next batch of a pool, returning the loss.

    PyTorch eager, torch.compile, JAX jit   x   projected, bilinear
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from attn.model import fast, pairs
from attn.model.fast import Batch, ModelSpec

FORMULATIONS = ("projected", "bilinear")
FRAMEWORKS = ("torch", "torch.compile", "jax")


def available(framework: str) -> bool:
    """Whether the framework imports (PyTorch for both of its rivals)."""
    try:
        if framework == "jax":
            import jax  # noqa: F401
        else:
            import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _ops(framework: str) -> dict[str, Callable]:
    """The few operations the formulation needs, in the framework's words."""
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        return {
            "T": lambda a: jnp.swapaxes(a, -1, -2),
            "softmax": lambda a: jax.nn.softmax(a, axis=-1),
            "log_softmax": lambda a: jax.nn.log_softmax(a, axis=-1),
            "where": jnp.where,
            "take": lambda a, i: jnp.take_along_axis(a, i[..., None], axis=-1)[..., 0],
            "array": jnp.asarray,
            "ninf": -jnp.inf,
        }
    import torch

    return {
        "T": lambda a: a.transpose(-1, -2),
        "softmax": lambda a: torch.softmax(a, dim=-1),
        "log_softmax": lambda a: torch.log_softmax(a, dim=-1),
        "where": torch.where,
        "take": lambda a, i: torch.gather(a, -1, i[..., None])[..., 0],
        "array": lambda a: torch.from_numpy(np.ascontiguousarray(a)),
        "ninf": float("-inf"),
    }


def loss_function(spec: ModelSpec, framework: str, formulation: str, positions, batch_size: int) -> Callable:
    """loss(params, tokens, targets, target_mask) in the framework (module docstring)."""
    ops = _ops(framework)
    T, D = spec.n_positions, spec.d_model
    query_rows = np.arange(T)[positions]
    P = len(query_rows)
    s = spec.score_scale
    merge_qk = pairs.merge_is_cheaper(batch_size * P, D, spec.d_k, D)
    merge_ov = pairs.merge_is_cheaper(batch_size * P, D, spec.d_v, D)
    masked = ops["array"](np.triu(np.ones((T, T), dtype=bool), k=1)[query_rows]) if spec.causal else None
    sinusoids = (
        ops["array"](np.array(fast.sinusoidal_positions(T, D, spec.n_sources**-0.5, spec.dtype)))
        if spec.positional == "sinusoidal"
        else None
    )
    rows = ops["array"](query_rows)

    def loss(params, tokens, targets, target_mask):
        x = sum(params[f"E_{name}"][tokens[..., f]] for f, (name, _) in enumerate(spec.fields))
        if spec.positional == "learned":
            x = x + params["E_pos"][:T]  # (B, T, D)
        elif sinusoids is not None:
            x = x + sinusoids
        x_q = x[:, rows]  # (B, P, D)
        if formulation == "projected":
            scores = ((x_q @ params["W_q"]) * s) @ ops["T"](x @ params["W_k"])  # (B, P, T)
        elif merge_qk:
            scores = (x_q @ ((params["W_q"] @ ops["T"](params["W_k"])) * s)) @ ops["T"](x)
        else:
            scores = (((x_q @ params["W_q"]) * s) @ ops["T"](params["W_k"])) @ ops["T"](x)
        if masked is not None:
            scores = ops["where"](masked, ops["ninf"], scores)
        attn = ops["softmax"](scores)  # (B, P, T)
        if formulation == "projected":
            out = (attn @ (x @ params["W_v"])) @ params["W_o"]
        elif merge_ov:
            out = (attn @ x) @ (params["W_v"] @ params["W_o"])
        else:
            out = ((attn @ x) @ params["W_v"]) @ params["W_o"]
        h = x_q + out if spec.residual else out
        log_probs = ops["log_softmax"](h @ params["W_out"] + params["b_out"])  # (B, P, C)
        weight = target_mask[:, rows]
        return -(ops["take"](log_probs, targets[:, rows]) * weight).sum() / weight.sum()

    return loss


def pooled_target_positions(batches: list[Batch]):
    """The positions where some example of the pool has a target (as attn.model.fast computes them)."""
    return fast.target_positions(
        Batch(
            *(
                np.concatenate([getattr(b, f) for b in batches])
                for f in ("tokens", "targets", "target_mask", "target_key")
            )
        )
    )


def stepper(
    framework: str, formulation: str, spec: ModelSpec, params: dict, batches: list[Batch], lr: float
) -> Callable[[], float]:
    """step() -> loss: one SGD step of the rival on the next batch of the pool,
    from copies of `params`, its query side where some example has a target."""
    loss = loss_function(spec, framework, formulation, pooled_target_positions(batches), len(batches[0].tokens))
    pool = [(b.tokens, b.targets, b.target_mask.astype(spec.dtype)) for b in batches]  # the mask as weights
    if framework == "jax":
        return _jax_stepper(loss, params, pool, lr)
    return _torch_stepper(loss, params, pool, lr, compiled=framework == "torch.compile")


def _torch_stepper(loss, params: dict, batches: list[tuple], lr: float, compiled: bool) -> Callable[[], float]:
    import torch

    weights = {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}
    pool = itertools.cycle([tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in batch) for batch in batches])
    compute = torch.compile(loss, dynamic=False) if compiled else loss
    leaves = list(weights.values())

    def step():
        value = compute(weights, *next(pool))
        grads = torch.autograd.grad(value, leaves)
        with torch.no_grad():
            torch._foreach_add_(leaves, grads, alpha=-lr)
        return float(value.detach())

    return step


def _jax_stepper(loss, params: dict, batches: list[tuple], lr: float) -> Callable[[], float]:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def update(weights, tokens, targets, target_mask):
        value, grads = jax.value_and_grad(loss)(weights, tokens, targets, target_mask)
        return jax.tree_util.tree_map(lambda w, g: w - lr * g, weights, grads), value

    state = {"weights": {name: jnp.asarray(p) for name, p in params.items()}}
    pool = itertools.cycle([tuple(jnp.asarray(a) for a in batch) for batch in batches])

    def step():
        state["weights"], value = update(state["weights"], *next(pool))
        return float(value.block_until_ready())

    return step
