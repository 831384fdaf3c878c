"""Issue 45's factorial knobs: model.qk_gain_exponent sets Var(q.k) at init independently of d_k, and with
optim.qk_lr_exponent it re-expresses the scaled head exactly: scores s QK^T with gain 1 are the unscaled
scores of W' = W d_k^-1/4, and SGD at rate lr on W is SGD at rate lr d_k^-1/2 on W' (the same run, to rounding)."""

import math
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY

from attn.config.loading import build_spec, build_task, load_config, qk_gain
from attn.store import runs
from attn.train import lifecycle


def test_the_gain_exponent_scales_the_init_gain_with_d_k():
    config = load_config(None, ["model.d_k=1024", "model.qk_gain_exponent=-0.25"])
    assert qk_gain(config) == pytest.approx(1024**-0.25)
    assert build_spec(config, build_task(config)).qk_gain == pytest.approx(0.1767767, rel=1e-6)
    assert qk_gain(load_config(None, ["model.d_k=1024"])) == 1.0


def trained(tmp_path, name: str, *overrides) -> list[dict]:
    config = load_config(
        None,
        [
            *TINY,
            "model.d_k=64",
            "dtype=float64",
            "train.steps=60",
            "logging.log_every=5",
            f"runs_dir={tmp_path}",
            *overrides,
        ],
    )
    run_dir = lifecycle.create(config, name=name)
    lifecycle.execute(config, run_dir)
    return runs.read_metrics(run_dir)


def test_unscaled_with_gain_and_rate_exponents_is_the_scaled_head(tmp_path):
    scaled = trained(tmp_path, "scaled", "model.scale=sqrt", "optim.lr=0.5")
    same = trained(
        tmp_path,
        "reparametrised",
        "model.scale=none",
        "model.qk_gain_exponent=-0.25",
        "optim.qk_lr_exponent=-0.5",
        "optim.lr=0.5",
    )
    different = trained(tmp_path, "unscaled", "model.scale=none", "optim.lr=0.5")
    losses = [np.array([r["train_loss"] for r in records]) for records in (scaled, same, different)]
    assert np.allclose(losses[0], losses[1], rtol=1e-9, atol=0), "the same run, to float64 rounding"
    assert not np.allclose(losses[0], losses[2], rtol=1e-3)
    assert math.isclose(scaled[0]["score_std"], same[0]["score_std"], rel_tol=1e-9)


def test_reports_say_which_wide_cells_share_their_seeds_initial_draws():
    """Issue 45 item 5: width-free cells drawn by the Bartlett decomposition start from the same deviates."""
    from attn.experiment.spec import load_experiment
    from attn.report.experiment_report import shared_draws_lines, shared_initial_draws

    root = Path(__file__).resolve().parents[1] / "experiments"
    assert shared_initial_draws(load_experiment(root / "sqrt_dk.yaml", "/nonexistent")) == [65536, 1048576]
    assert shared_initial_draws(load_experiment(root / "two_factors.yaml", "/nonexistent")) == []
    assert shared_draws_lines([]) == [] and "65536, 1048576" in shared_draws_lines([65536, 1048576])[0]
    brief = shared_draws_lines([65536, 1048576], brief=True)[0]
    assert "65536, 1048576" in brief and len(brief) < len(shared_draws_lines([65536, 1048576])[0])


def test_the_run_figures_theory_line_uses_the_gain_the_run_started_with():
    from attn.train.figures import model_theory_score_std

    model = {"scale": "none", "d_k": 4096, "qk_gain": 1.0, "qk_gain_exponent": -0.25}
    assert model_theory_score_std(model) == pytest.approx(1.0)  # Var(q.k) = 1 at init: the exponent's purpose
    assert model_theory_score_std({**model, "qk_gain_exponent": 0.0}) == pytest.approx(64.0)
