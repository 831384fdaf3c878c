"""The benchmark's rivals compute attn's step: the same losses over three SGD
steps from the same weights on the same batches, in every formulation
(skipped for a framework that is not installed; torch.compile shares the
PyTorch loss and is exercised by `make bench` only, its compilation being slow)."""

import numpy as np
import pytest

from attn.bench import rivals
from attn.config.loading import load_config
from attn.model import fast
from attn.store import runstate

CASES = {
    "retrieval": (),
    "copy-causal": ("task.name=copy", "model.causal=true"),
    "wide": ("model.d_k=256",),
    "unscaled-sinusoidal": ("model.scale=none", "model.positional=sinusoidal", "model.residual=false"),
}


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_rival_takes_attns_steps(framework, case):
    if not rivals.available(framework):
        pytest.skip(f"{framework} is not installed")
    config = load_config(None, ["model.d_model=32", "train.batch_size=16", *CASES[case]])
    task, spec, params, optimizer, gens = runstate.build(config)
    batches = [task.sample(gens.data, config.train.batch_size) for _ in range(3)]
    ours, weights = [], {name: p.copy() for name, p in params.items()}
    for batch in batches:
        loss, grads, _ = fast.loss_and_grads(weights, spec, batch)
        optimizer.step(weights, grads, config.optim.lr)
        ours.append(float(loss))
    for formulation in rivals.FORMULATIONS:
        step = rivals.stepper(framework, formulation, spec, params, batches, config.optim.lr)
        theirs = [step() for _ in batches]
        np.testing.assert_allclose(theirs, ours, rtol=2e-5, err_msg=formulation)
        assert theirs[-1] != pytest.approx(theirs[0], rel=1e-4), "the steps changed nothing: the check would be empty"
