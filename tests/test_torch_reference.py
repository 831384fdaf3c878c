"""attn's hand-written model against references, in float64: its PyTorch twin
(attn.bench.rivals' loss at every position, the textbook model) gives the
same loss and gradients, and torch.optim.SGD the same steps (PyTorch's
autograd is the independent reference; skipped without PyTorch); and
model's shortcut, which runs the query side only at positions with a
target, gives what the full computation gives."""

import itertools

import numpy as np
import pytest

from attn.bench import rivals
from attn.config.loading import load_config
from attn.model import fast
from attn.model.fast import Batch
from attn.store import runstate

SMALL = ["dtype=float64", "train.batch_size=4", "model.d_model=12", "model.d_k=5", "model.d_v=7"]
TASKS = {
    "retrieval": ["task.name=retrieval", "task.n_keys=6", "task.n_values=5", "task.n_pairs=4"],
    "copy": ["task.name=copy", "task.vocab_size=6", "task.length=5"],
}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def torch_twin(spec, batch, params):
    """(loss, leaf tensors): the textbook model in PyTorch, from copies of params."""
    import torch

    weights = {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}
    loss = rivals.loss_function(spec, "torch", "projected", slice(None), len(batch.tokens))
    arrays = (batch.tokens, batch.targets, batch.target_mask.astype(spec.dtype))
    return loss(weights, *(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)), weights


def torch_sgd_stepper(config, spec, params, batches):
    """step() -> loss: torch.optim.SGD with the config's settings (one group per parameter, for lr_mult)."""
    import torch

    o = config.optim
    pool = itertools.cycle(batches)
    weights = {name: torch.tensor(p, requires_grad=True) for name, p in params.items()}
    groups = [{"params": [w], "lr": o.lr * o.lr_mult.get(name, 1.0)} for name, w in weights.items()]
    optimizer = torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
    loss = rivals.loss_function(spec, "torch", "projected", slice(None), config.train.batch_size)

    def step():
        batch = next(pool)
        optimizer.zero_grad()
        value = loss(
            weights,
            *(
                torch.from_numpy(np.ascontiguousarray(a))
                for a in (batch.tokens, batch.targets, batch.target_mask.astype(spec.dtype))
            ),
        )
        value.backward()
        optimizer.step()
        return value.item()

    return step


def build(task: str, *overrides: str):
    config = load_config(None, [*SMALL, *TASKS[task], *overrides])
    task_, spec, params, optimizer, gens = runstate.build(config)
    batches = [task_.sample(gens.data, config.train.batch_size) for _ in range(3)]
    return config, spec, params, optimizer, batches


CASES = [
    (task, f"model.scale={scale}", f"model.causal={causal}")
    for task, scale, causal in itertools.product(TASKS, ("sqrt", "none"), ("false", "true"))
]
CASES.append(("copy", "model.positional=sinusoidal", "model.residual=false"))


@pytest.mark.parametrize("task,first,second", CASES, ids=lambda v: v.removeprefix("model."))
def test_loss_and_gradients_match_pytorch(torch, task, first, second):
    _, spec, params, _, (batch, *_) = build(task, first, second)
    reference, weights = torch_twin(spec, batch, params)
    reference.backward()
    loss, grads, _ = fast.loss_and_grads(params, spec, batch)
    assert loss.dtype == np.float64
    assert float(loss) == pytest.approx(reference.item(), rel=1e-12)
    assert set(grads) == set(weights)
    for name, grad in grads.items():
        expected = weights[name].grad.numpy()
        assert np.abs(expected).max() > 0, f"{name}: no gradient reached it; the check would be empty"
        np.testing.assert_allclose(grad, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max(), err_msg=name)


@pytest.mark.parametrize(
    "optim",
    [
        ("optim.lr=0.5",),
        (
            "optim.lr=0.3",
            "optim.momentum=0.9",
            "optim.nesterov=true",
            "optim.weight_decay=0.01",
            "optim.lr_mult={W_q: 0.5, E_pos: 2.0}",
        ),
    ],
    ids=["plain", "nesterov-decay-lr_mult"],
)
def test_sgd_steps_match_torch_optim_sgd(torch, optim):
    """Three steps from the same weights on the same batches: the third loss
    depends on both updates (momentum included) of every parameter."""
    config, spec, params, optimizer, batches = build("retrieval", *optim)
    torch_step = torch_sgd_stepper(config, spec, params, batches)
    weights = {name: p.copy() for name, p in params.items()}
    for batch in batches:
        loss, grads, _ = fast.loss_and_grads(weights, spec, batch)
        optimizer.step(weights, grads, config.optim.lr)
        ours, theirs = float(loss), torch_step()
        assert ours == pytest.approx(theirs, rel=1e-12)
    initial = runstate.build(config)[2]
    assert ours != pytest.approx(float(fast.forward(initial, spec, batches[-1])[0]), rel=1e-6), (
        "the updates changed nothing, so the comparison shows nothing"
    )


def test_forward_and_backward_at_target_positions_equal_the_full_ones():
    """Retrieval (targets at the query only) and a batch whose targets sit at
    a few scattered positions: model.forward and backward, which skip the
    query rows without a target (and hand X's gradient to the embeddings as
    factors), give the loss and gradients of the computation over every row."""
    _, spec, params, _, (retrieval, *_) = build("retrieval", "model.scale=none", "model.causal=true")
    B, T = retrieval.targets.shape
    scattered = np.zeros((B, T), dtype=bool)
    scattered[0, 1] = scattered[1, 1] = scattered[2, 3] = True
    for batch in (retrieval, Batch(retrieval.tokens, retrieval.targets, scattered, retrieval.target_key)):
        loss, cache = fast.forward(params, spec, batch)
        assert not isinstance(cache["positions"], slice), "the shortcut must be taken for the check to mean anything"
        grads = fast.backward(cache, spec)
        full_loss, full_cache = fast.forward(params, spec, batch, all_queries=True)
        assert full_cache["attn"]["attn"].shape == (B, T, T)
        assert float(loss) == pytest.approx(float(full_loss), rel=1e-12)
        full = fast.backward(full_cache, spec)
        for name, grad in full.items():
            np.testing.assert_allclose(grads[name], grad, rtol=1e-12, atol=1e-14 * np.abs(grad).max(), err_msg=name)
