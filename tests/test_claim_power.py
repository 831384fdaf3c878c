"""Issue 44 item 8 and issue 45 items 1-3: a claim's power from the design alone (the smallest p its
test can reach, the smallest effect that confirms it), frozen with the claims; an undecidable claim
refused with the number of seeds that would decide it; claims judged within a budget of steps."""

import json
from pathlib import Path

import pytest
import yaml

from attn.analysis import stats
from attn.analysis.grouping import Run
from attn.analysis.results import seed_of
from attn.config.yamlio import ConfigError
from attn.experiment import report_spec
from attn.experiment import spec as experiments
from attn.experiment.report_spec import Expectation, cannot_fail, power, seeds_needed
from attn.experiment.sweep import freeze_claims

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "default.yaml"
SQRT, NONE = (("model.scale", "sqrt"),), (("model.scale", "none"),)


def comparison(test="mcnemar", stat="success_rate", **fields) -> Expectation:
    return Expectation("c", "c", stat, SQRT, "best", (), NONE, None, None, test, **fields)


def bound(above=0.5, n_stat="success_rate") -> Expectation:
    return Expectation("b", "b", n_stat, SQRT, "best", (), None, above, None, "interval")


def test_the_smallest_p_of_each_exact_test():
    assert report_spec.smallest_p("mcnemar", 20) == report_spec.smallest_p("sign", 20) == 0.5**20
    assert report_spec.smallest_p("fisher", 5) == 1 / 252


@pytest.mark.parametrize("points, needed", [(1, 7), (3, 8)])
def test_seeds_needed_is_the_fewest_with_which_the_claim_can_go_either_way(points, needed):
    level = 0.05 / 4  # four tested claims: the strictest Holm step
    e = comparison()
    assert seeds_needed(e, 1500, level, points) == needed
    assert not cannot_fail(e, needed, 1500, level, points) and cannot_fail(e, needed - 1, 1500, level, points)


def test_seeds_needed_for_a_bound_judged_by_its_interval():
    e = bound(above=0.5)
    n = seeds_needed(e, 1500, 0.05)
    low_at_n, _ = report_spec._wilson(n, n)
    assert low_at_n > 0.5 and report_spec._wilson(n - 1, n - 1)[0] <= 0.5


def test_a_claim_no_number_of_seeds_decides_says_so():
    assert seeds_needed(bound(above=1.0), 1500, 0.05) is None  # a rate is never above 1


def test_power_of_a_paired_test_names_the_smallest_effect_that_confirms_it():
    figures = power(comparison(), 20, 0.05 / 4)
    assert figures["smallest_p"] == 0.5**20 and figures["n"] == 20 and figures["level"] == 0.0125
    assert figures["smallest_effect"].startswith("7 discordant pairs")  # 0.5**7 = 0.0078 <= 0.0125 < 0.5**6


def test_power_of_a_bound_is_the_count_that_puts_its_interval_past_the_bound():
    figures = power(bound(above=0.5), 20, 0.05)
    k = int(figures["smallest_effect"].split()[0])
    assert stats.wilson_interval(k, 20)[0] > 0.5 >= stats.wilson_interval(k - 1, 20)[0]


def test_the_wilson_formula_here_agrees_with_the_statistics_module():
    for k, n in ((0, 10), (3, 10), (10, 10), (7, 20)):
        assert report_spec._wilson(k, n) == pytest.approx(stats.wilson_interval(k, n), abs=1e-12)


def write(tmp_path, expect, seeds=20) -> Path:
    data = {
        "name": "exp",
        "base": str(CONFIG),
        "overrides": {"train.steps": 40, "logging.log_every": 10},
        "grid": {"model.d_k": [16], "model.scale": ["sqrt", "none"], "optim.lr": [0.1, 0.3]},
        "seeds": list(range(seeds)),
        "report": {"x": "model.d_k", "arm": "model.scale", "best_of": "optim.lr", "expect": expect},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def mcnemar_claim(**fields) -> dict:
    return {
        "id": "scaled-learns-more",
        "claim": "c",
        "stat": "success_rate",
        "arm": {"model.scale": "sqrt"},
        "better_than": {"model.scale": "none"},
        **fields,
    }


def test_an_undecidable_claim_is_refused_with_the_seeds_it_would_need(tmp_path):
    path = write(tmp_path, [mcnemar_claim()], seeds=4)
    with pytest.raises(ConfigError) as caught:
        experiments.load_experiment(path, str(tmp_path / "runs"))
    assert "expect[0]" in str(caught.value) and "would need 5 judging seeds per arm" in str(caught.value)


def test_the_power_is_frozen_with_the_claims_outside_their_digest(tmp_path):
    experiment = experiments.load_experiment(write(tmp_path, [mcnemar_claim()]), str(tmp_path / "runs"))
    record = json.loads(freeze_claims(experiment).read_text())
    assert record["power"]["scaled-learns-more"]["smallest_p"] == 0.5**20
    plain = report_spec.claims_record(experiment.report.__class__(**{**experiment.report.__dict__, "power": ()}), [])
    assert "power" not in plain and "power" not in record["section"]


@pytest.mark.parametrize("budget", [0, 41, "soon"])
def test_a_claim_budget_past_the_runs_is_refused(tmp_path, budget):
    with pytest.raises(ConfigError) as caught:
        experiments.load_experiment(write(tmp_path, [mcnemar_claim(budget=budget)]), str(tmp_path / "runs"))
    assert "budget" in str(caught.value) and "40" in str(caught.value)


def test_a_budget_is_part_of_the_claim_text_only_when_set():
    assert "within 1500 steps" in report_spec.expectation_text(comparison(budget=1500))
    assert "within" not in report_spec.expectation_text(comparison())


def synthetic_run(tmp_path, name, curve, status="completed", steps=6000) -> Run:
    """A run read back: (step, eval accuracy, eval loss) records, its summary with the retrieval task's levels."""
    records = [{"step": s, "eval_accuracy": a, "eval_loss": v} for s, a, v in curve]
    summary = {"status": status, "steps": steps, "references": {"chance": 2.77, "no_retrieval": 1.8}}
    (tmp_path / name).mkdir()
    return Run(tmp_path / name, {}, records, summary, status)


def test_a_seed_at_a_budget_is_judged_on_its_curve_up_to_then(tmp_path):
    """Learned by 6000 but not by 1500: slow (or stalled) within 1500; a run diverged at 3000 had not by 1500."""
    late = synthetic_run(tmp_path, "late", [(0, 0.06, 2.7), (1500, 0.06, 2.6), (3000, 0.5, 1.0), (6000, 1.0, 0.01)])
    assert seed_of(late, 0, 0.99).outcome.outcome == "learned"
    within = seed_of(late, 0, 0.99, budget=1500)
    assert (within.outcome.outcome, within.budget) == ("stalled", 1500)
    assert within.outcome.time_to_threshold == (1500, False)
    blown = synthetic_run(tmp_path, "blown", [(0, 0.06, 2.7), (1500, 0.5, 1.0), (3000, None, None)], "diverged")
    assert seed_of(blown, 0, 0.99).outcome.outcome == "diverged"
    assert seed_of(blown, 0, 0.99, budget=1500).outcome.outcome == "slow"
    assert seed_of(blown, 0, 0.99, budget=3000).outcome.outcome == "diverged"
