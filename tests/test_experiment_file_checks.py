"""Experiment files refused when read, not after their runs (found by a fuzz of
the CLI): an override of a key the grid varies (the grid's value would win, the
override silently dropped); a claim whose arm, better_than or point (where, at:
shared) has no cell of the grid (inconclusive for ever); an lr_sensitivity
bound that cannot fail (the statistic is never below 0)."""

from pathlib import Path

import pytest
import yaml
from helpers import facts_in

from attn import cli
from attn.cli import common
from attn.config.yamlio import ConfigError
from attn.experiment import spec as experiments
from attn.experiment.report_spec import Expectation, cannot_fail

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "default.yaml"
TINY = {"train.steps": 5, "logging.log_every": 1}
SEEDS = list(range(6))
# two grid blocks: arm [model.scale, optim.name] is (sqrt, sgd) at d_k 8 and 16, (none, adam) at d_k 8 only,
# and only (sqrt, sgd) has the shared rate 0.1
BLOCKS = [
    {"model.d_k": [8, 16], "model.scale": ["sqrt"], "optim.name": ["sgd"], "optim.lr": [0.1, 0.3]},
    {"model.d_k": [8], "model.scale": ["none"], "optim.name": ["adam"], "optim.lr": [0.3]},
]
LAYOUT = {"x": "model.d_k", "arm": ["model.scale", "optim.name"], "best_of": "optim.lr", "shared": 0.1}
SQRT_SGD = {"model.scale": "sqrt", "optim.name": "sgd"}
NONE_ADAM = {"model.scale": "none", "optim.name": "adam"}


def write(tmp_path, grid=BLOCKS, report=None, overrides=None, name="exp") -> Path:
    data = {
        "name": name,
        "base": str(CONFIG),
        "overrides": {**TINY, **(overrides or {})},
        "grid": grid,
        "seeds": SEEDS,
        "report": report or {},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        experiments.load_experiment(path, str(path.parent / "runs"))
    return str(caught.value)


def claim(**fields) -> dict:
    """An expectation on (sqrt, sgd)'s final loss, `below: 10` unless `fields` give a rule."""
    rule = {} if {"above", "below", "better_than"} & set(fields) else {"below": 10}
    return {"id": "c1", "claim": "c", "stat": "final_loss", "arm": SQRT_SGD, **rule, **fields}


def call(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- 1. an override of a key the grid varies --------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{"model.d_k": 4}, {"model": {"d_k": 4}}])
def test_a_file_override_of_a_grid_key_is_refused(tmp_path, overrides):
    path = write(tmp_path, grid={"model.d_k": [8, 16]}, overrides=overrides)
    assert facts_in(refusal(path), str(path), "overrides", "model.d_k", "4")


def test_a_command_line_override_of_a_grid_key_is_refused_and_nothing_is_written(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    code, out, err = call(
        capsys,
        "sweep",
        CONFIG,
        "--grid",
        "model.d_k=8,16",
        "--name",
        "x",
        "--runs-dir",
        runs_dir,
        "--workers",
        "1",
        "train.steps=5",
        "model.d_k=16",
    )
    assert code == common.EXIT_BAD_INPUT == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert facts_in(err, "model.d_k=16", "--grid")
    assert not runs_dir.exists()
    with pytest.raises(ConfigError, match="model.d_k"):
        experiments.command_line_experiment(CONFIG, ["model.d_k=8,16"], "0", "x", ["model.d_k=16"], str(runs_dir))


def test_an_experiment_file_with_a_grid_key_in_its_overrides_exits_2_and_runs_nothing(tmp_path, capsys):
    path = write(tmp_path, grid={"model.d_k": [8, 16]}, overrides={"model.d_k": 4})
    code, out, err = call(capsys, "sweep", path, "--runs-dir", tmp_path / "runs", "--workers", "1")
    assert code == 2 and out == "" and "Traceback" not in err
    assert facts_in(err, "overrides", "model.d_k", "4")
    assert not (tmp_path / "runs").exists()


# --- 2. a claim with no cell of the grid to judge -----------------------------------------------------------------
@pytest.mark.parametrize(
    "rule, facts",
    [
        # an arm each of whose values is in the grid, but not together
        (
            {"arm": {"model.scale": "sqrt", "optim.name": "adam"}},
            [
                "arm",
                "{model.scale: sqrt, optim.name: adam}",
                "{model.scale: sqrt, optim.name: sgd}",
                "{model.scale: none, optim.name: adam}",
            ],
        ),
        (
            {"better_than": {"model.scale": "none", "optim.name": "sgd"}},
            ["better_than", "{model.scale: none, optim.name: sgd}", "{model.scale: none, optim.name: adam}"],
        ),
        # the arm has no cell at the shared rate
        (
            {"arm": NONE_ADAM, "at": "shared"},
            ["at", "shared", "{model.scale: none, optim.name: adam}", "optim.lr = 0.1"],
        ),
        # the arm has no cell at the x named by where; the grid offers it at d_k 8
        (
            {"arm": NONE_ADAM, "where": {"model.d_k": [16]}},
            ["where", "{model.d_k: 16}", "{model.scale: none, optim.name: adam}", "{model.d_k: 8}"],
        ),
        # the other arm has no cell at the x named by where
        (
            {"better_than": NONE_ADAM, "where": {"model.d_k": [16]}},
            ["where", "better_than", "{model.d_k: 16}", "{model.d_k: 8}"],
        ),
        # no where: every x is a point, and the arm lacks one of them (it could never be confirmed)
        ({"arm": NONE_ADAM}, ["where", "{model.d_k: 16}", "{model.d_k: 8}"]),
    ],
)
def test_a_claim_on_no_cell_of_the_grid_is_refused_naming_its_id_and_field(tmp_path, rule, facts):
    path = write(tmp_path, report={**LAYOUT, "expect": [claim(**rule)]})
    assert facts_in(refusal(path), str(path), "expect[0] (c1)", *facts)


def test_a_claim_at_shared_where_no_cell_has_the_shared_value_is_refused(tmp_path):
    grid = [
        {"model.d_k": [8], "model.scale": ["sqrt", "none"], "optim.lr": [0.1, 0.3]},
        {"model.d_k": [16], "model.scale": ["sqrt", "none"], "optim.lr": [0.3]},
    ]
    report = {
        "x": "model.d_k",
        "arm": "model.scale",
        "best_of": "optim.lr",
        "shared": 0.1,
        "expect": [claim(arm={"model.scale": "sqrt"}, at="shared", where={"model.d_k": [16]})],
    }
    assert facts_in(
        refusal(write(tmp_path, grid=grid, report=report)), "expect[0] (c1)", "at", "shared", "optim.lr = 0.1"
    )


def test_of_four_claims_the_three_on_no_cell_are_refused_and_the_fourth_loads(tmp_path):
    """The fuzz's nomatch-run file: its four claims, one file each."""
    claims = {
        "e1": claim(id="e1", arm={"model.scale": "sqrt", "optim.name": "adam"}, stat="success_rate", above=0.5),
        "e2": claim(id="e2", better_than={"model.scale": "none", "optim.name": "sgd"}),
        "e3": claim(id="e3", arm=NONE_ADAM, at="shared"),
        "e4": claim(id="e4"),
    }
    for key in ("e1", "e2", "e3"):
        assert facts_in(refusal(write(tmp_path, report={**LAYOUT, "expect": [claims[key]]}, name=key)), f"({key})")
    experiment = experiments.load_experiment(
        write(tmp_path, report={**LAYOUT, "expect": [claims["e4"]]}), str(tmp_path / "runs")
    )
    assert [e.id for e in experiment.report.expect] == ["e4"]


def test_a_claim_on_an_arm_a_block_leaves_unset_is_still_accepted(tmp_path):
    """An arm key some block does not set may be left out of the claim (None): its cells match."""
    grid = [
        {"model.d_k": [8, 16], "model.scale": ["sqrt", "none"], "optim.name": ["adam"]},
        {"model.d_k": [8, 16], "model.scale": ["sqrt"]},
    ]
    report = {"x": "model.d_k", "arm": ["model.scale", "optim.name"], "expect": [claim(arm={"model.scale": "sqrt"})]}
    assert experiments.load_experiment(write(tmp_path, grid=grid, report=report), str(tmp_path / "runs"))


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_experiment_file_of_the_repository_still_loads(path, tmp_path):
    assert experiments.load_experiment(path, str(tmp_path)).cells


# --- 3. an lr_sensitivity bound that cannot fail ------------------------------------------------------------------
@pytest.mark.parametrize(
    "rule, verdict",
    [
        ({"above": -5.0}, "not confirmed"),
        ({"above": 0.0}, "not confirmed"),
        ({"below": 0.0}, "confirmed"),
        ({"below": -1.0}, "confirmed"),
    ],
)
def test_an_lr_sensitivity_bound_at_or_below_0_cannot_fail(rule, verdict):
    e = Expectation("s", "c", "lr_sensitivity", (("model.scale", "sqrt"),), "best", **rule)
    assert facts_in(
        cannot_fail(e, 10, 1000, 0.05), f"it can never be {verdict}:", "sensitivity", f"{next(iter(rule.values())):g}"
    )


@pytest.mark.parametrize("rule", [{"above": 0.1}, {"below": 0.1}])
def test_an_lr_sensitivity_bound_above_0_can_go_either_way(rule):
    assert (
        cannot_fail(Expectation("s", "c", "lr_sensitivity", (("model.scale", "sqrt"),), "best", **rule), 10, 1000, 0.05)
        == ""
    )


@pytest.mark.parametrize("rule, value", [({"above": -5}, "-5"), ({"below": 0}, "0")])
def test_a_file_with_an_lr_sensitivity_claim_that_cannot_fail_is_refused(tmp_path, rule, value):
    report = {
        "x": "model.d_k",
        "arm": "model.scale",
        "best_of": "optim.lr",
        "sensitivity": True,
        "expect": [{"id": "flat", "claim": "c", "stat": "lr_sensitivity", "arm": {"model.scale": "sqrt"}, **rule}],
    }
    grid = {"model.d_k": [8], "model.scale": ["sqrt", "none"], "optim.lr": [0.1, 0.3]}
    assert facts_in(refusal(write(tmp_path, grid=grid, report=report)), "expect[0] (flat)", "never", value)


def test_sensitivity_without_a_best_of_says_what_is_missing(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "base": str(REPO / "configs" / "default.yaml"),
                "grid": {"model.d_k": [8, 16]},
                "seeds": [0],
                "report": {"x": "model.d_k", "sensitivity": True},
            }
        )
    )
    with pytest.raises(ConfigError, match="sensitivity: got true without a best_of; expected a best_of"):
        experiments.load_experiment(path, str(tmp_path / "runs"))


CLAIM = {"id": "sgd-learns", "claim": "SGD learns", "stat": "success_rate", "arm": SQRT_SGD, "above": 0.5}


def test_a_claims_history_is_read_beside_it_and_leaves_its_rule_and_digest_as_they_were(tmp_path):
    from attn.experiment import report_spec

    def loaded(claim):
        experiment = experiments.load_experiment(
            write(tmp_path, report={**LAYOUT, "expect": [claim]}), runs_dir=str(tmp_path)
        )
        return experiment, report_spec.claims_record(experiment.report, set(SEEDS))["digest"]

    plain, digest = loaded(CLAIM)
    edited, edited_digest = loaded({**CLAIM, "edited_after_runs": "weakened from 0.7 after the runs of abc1234"})
    assert plain.report.expect[0].edited_after_runs == ""
    assert edited.report.expect[0].edited_after_runs == "weakened from 0.7 after the runs of abc1234"
    assert edited_digest == digest  # the history is not the rule: no claim changed, nothing re-frozen


@pytest.mark.parametrize("value", ["", "  ", ["a list"], 3, "two\nlines"])
def test_a_claims_history_that_is_not_one_line_is_refused_naming_the_field(tmp_path, value):
    path = write(tmp_path, report={**LAYOUT, "expect": [{**CLAIM, "edited_after_runs": value}]})
    with pytest.raises(ConfigError) as caught:
        experiments.load_experiment(path, runs_dir=str(tmp_path))
    assert facts_in(str(caught.value), "expect[0]", "edited_after_runs", "one line")


def test_a_runs_directory_may_be_given_as_a_path(tmp_path):
    experiment = experiments.load_experiment(write(tmp_path), runs_dir=tmp_path / "runs")
    assert experiment.directory == tmp_path / "runs" / "exp"
    assert {cell.config.runs_dir for cell in experiment.cells} == {str(tmp_path / "runs")}


def test_a_section_in_the_overrides_sets_its_fields_and_keeps_the_bases_others(tmp_path):
    (tmp_path / "base.yaml").write_text("model: {d_model: 8}\ntrain: {batch_size: 8, steps: 50}\n")
    path = tmp_path / "e.yaml"
    path.write_text("name: e\nbase: base.yaml\noverrides: {train: {steps: 5}}\ngrid: {optim.lr: [0.1]}\nseeds: [0]\n")
    (cell,) = experiments.load_experiment(path, str(tmp_path / "runs")).cells
    assert (cell.config.train.steps, cell.config.train.batch_size) == (5, 8)  # the section was replaced whole


@pytest.mark.parametrize(
    "field, value",
    [("overrides", 0), ("overrides", []), ("overrides", False), ("report", 0), ("report", [])]
    + [("description", [1, 2]), ("description", 5)],
)
def test_a_top_level_value_of_the_wrong_kind_is_refused_even_when_empty(tmp_path, field, value):
    path = write(tmp_path)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, field: value}, sort_keys=False))
    assert facts_in(refusal(path), str(path), field, repr(value))


@pytest.mark.parametrize("value", [[1], "", "  ", None])
def test_a_claim_that_is_no_sentence_is_refused(tmp_path, value):
    path = write(tmp_path, report={**LAYOUT, "expect": [claim(claim=value)]})
    assert facts_in(refusal(path), str(path), "expect[0]", "claim", repr(value))


def test_an_empty_description_or_overrides_is_none(tmp_path):
    path = write(tmp_path, grid={"model.d_k": [8]})
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "description": None, "overrides": None}, sort_keys=False))
    experiment = experiments.load_experiment(path, str(tmp_path / "runs"))
    assert (experiment.description, experiment.cells[0].config.train.steps) == ("", 1500)
