"""attn.train.denormals: training flushes subnormal floats to zero, which
removes them from the gradients and leaves every weight as it was."""

import numpy as np
import pytest

from attn.config.loading import load_config
from attn.model import fast
from attn.store import runstate
from attn.train import denormals, lifecycle, loop

TINY = np.finfo(np.float32).tiny  # the smallest normal float32
pytestmark = pytest.mark.skipif(
    not denormals.can_flush(), reason="subnormals cannot be flushed on this platform (x86-64 glibc only)"
)


def subnormal_product() -> float:
    return float(np.float32(1e-38) * np.float32(0.1))  # 1e-39: subnormal, or 0 when flushed


def test_flushing_sets_the_mode_inside_and_restores_it_after():
    before = denormals.set_flushing(False)
    try:
        assert subnormal_product() != 0
        with denormals.flushing():
            assert subnormal_product() == 0
            with denormals.flushing(False):
                assert subnormal_product() != 0
            assert subnormal_product() == 0
        assert subnormal_product() != 0
    finally:
        denormals.set_flushing(before)


def test_training_runs_flushed(monkeypatch):
    seen = []
    monkeypatch.setattr(loop, "run_stack", lambda states, **_: seen.append(subnormal_product()) or [])
    before = denormals.set_flushing(False)
    try:
        lifecycle.execute_stack([])
        assert seen == [0.0]
        assert subnormal_product() != 0  # as it was, after
    finally:
        denormals.set_flushing(before)


def test_a_flushed_run_has_no_subnormal_gradients_and_the_same_weights():
    """W_out of ~1e-36 makes every gradient behind it subnormal: W_q's, W_k's,
    the embeddings'. Flushed, they are 0; the weights they would have moved
    (by ~1e-37) are the same bit for bit after five steps."""
    config = load_config(
        None, ["model.d_k=48", "model.scale=none", "model.width_free=false", "train.batch_size=8", "optim.momentum=0.9"]
    )
    after, first_grads = {}, {}
    for flush in (False, True):
        task, spec, params, optimizer, gens = runstate.build(config)
        params["W_out"] *= np.float32(1e-36)
        with denormals.flushing(flush):
            for step in range(5):
                batch = task.sample(gens.data, config.train.batch_size)
                _, grads, _ = fast.loss_and_grads(params, spec, batch)
                first_grads.setdefault(flush, grads)
                optimizer.step(params, grads, config.optim.lr)
        after[flush] = params
    kept, flushed = first_grads[False]["W_q"], first_grads[True]["W_q"]
    assert np.count_nonzero((kept != 0) & (np.abs(kept) < TINY)) > 0  # the case this test is about
    assert np.count_nonzero((flushed != 0) & (np.abs(flushed) < TINY)) == 0
    for name in after[False]:
        np.testing.assert_array_equal(after[True][name], after[False][name], err_msg=name)


def test_provenance_names_the_mode_training_runs_in():
    assert lifecycle.platform_facts()["denormals"] == "flushed to zero"  # one BLAS thread (tests/conftest.py)
    assert denormals.training_mode(1) == "flushed to zero"
    # numpy (so BLAS's threads) loaded before anything flushed, in this test process: a second thread keeps them
    assert denormals.training_mode(2).startswith("flushed to zero on the training thread")


def test_a_flushed_thread_is_restored_to_exactly_its_bits():
    before = denormals._bits(0x8000)  # flush-to-zero alone, as some other library might leave it
    try:
        with denormals.flushing():
            assert denormals._bits() == denormals.FTZ_DAZ
        assert denormals._bits() == 0x8000
    finally:
        denormals._bits(before)
