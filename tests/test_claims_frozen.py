"""Claims frozen before the runs (issue 24, item 3): the sweep records the report
section's digest and text when it first starts and keeps it; a report marks each
claim changed or added since, with the frozen text; a report says when its runs
come from several code states or uncommitted code, and publish refuses it unless
told."""

import json

import pytest
from helpers import publish_into
from test_publish import report as fake_report
from test_report import LEARNED, NONE, SQRT, STALLED, curve, load, report_of, write_plan

from attn import publish
from attn.config.schema import to_dict
from attn.experiment import report_spec
from attn.experiment.sweep import freeze_claims
from attn.store import runs

CLAIM = {"id": "learns-more", "claim": "sqrt learns more", "stat": "success_rate", "arm": SQRT, "better_than": NONE}
OTHER = {"id": "stalls-less", "claim": "sqrt stalls less", "stat": "stall_rate", "arm": SQRT, "better_than": NONE}
PLAN = {(16, "sqrt"): [curve(LEARNED)] * 10, (16, "none"): [curve(STALLED)] * 10}


def experiment_with(tmp_path, expect):
    return load(
        tmp_path,
        {"model.d_k": [16], "model.scale": ["sqrt", "none"]},
        range(10),
        {"x": "model.d_k", "arm": "model.scale", "expect": expect},
        "frozen",
    )


def test_the_first_sweep_records_the_claims_and_later_ones_keep_them(tmp_path):
    first = experiment_with(tmp_path, [CLAIM])
    path = freeze_claims(first)
    record = json.loads(path.read_text())
    assert path == first.directory / report_spec.CLAIMS_FILE
    assert record["digest"] == report_spec.claims_record(first.report, range(10))["digest"]
    assert record["section"]["expect"] == {"learns-more": report_spec.expectation_text(first.report.expect[0])}
    assert record["section"]["seeds"] == list(range(10))
    edited = experiment_with(tmp_path, [{**CLAIM, "test": "fisher"}])
    assert report_spec.claims_record(edited.report, range(10))["digest"] != record["digest"]
    freeze_claims(edited)
    assert json.loads(path.read_text()) == record, "kept from the first start"


def test_a_report_marks_each_claim_changed_or_added_after_the_runs_with_the_frozen_text(tmp_path):
    experiment = experiment_with(tmp_path, [CLAIM])
    freeze_claims(experiment)
    frozen_text = report_spec.expectation_text(experiment.report.expect[0])
    write_plan(experiment, PLAN.items(), ("model.d_k", "model.scale"))
    same = report_of(experiment, figures=False)
    assert same.expectation("learns-more")["frozen"] == "as frozen"
    assert "Every claim and the design (layout, selection rule, level, seeds) are as frozen" in same.md
    edited = experiment_with(tmp_path, [{**CLAIM, "test": "fisher"}, OTHER])
    result = report_of(edited, figures=False)
    changed, added = result.expectation("learns-more"), result.expectation("stalls-less")
    assert changed["frozen"] == "changed" and changed["frozen_text"] == frozen_text
    assert added["frozen"] == "added after the runs began"
    lines = result.md.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("- **learns-more**")))
    assert lines[at + 1] == f"  - changed after the runs began; as frozen: {frozen_text}"
    assert "1 changed, 1 added, 0 removed after runs existed" in result.md
    assert result.data["claims"]["changes"]["added"] == ["stalls-less"]


def test_a_report_without_frozen_claims_says_they_may_have_been_written_after(tmp_path):
    experiment = experiment_with(tmp_path, [CLAIM])
    write_plan(experiment, PLAN.items(), ("model.d_k", "model.scale"))
    result = report_of(experiment, figures=False)
    assert result.expectation("learns-more")["frozen"] == "not frozen" and not result.data["claims"]["frozen"]
    assert "The claims were not frozen before these runs" in result.md


def test_claims_recorded_after_runs_existed_are_not_called_frozen_before_them(tmp_path):
    experiment = experiment_with(tmp_path, [CLAIM])
    write_plan(experiment, PLAN.items(), ("model.d_k", "model.scale"))
    record = json.loads(freeze_claims(experiment).read_text())
    assert record["runs_before"] == 20
    result = report_of(experiment, figures=False)
    assert result.expectation("learns-more")["frozen"] == "not frozen"
    assert "only when 20 of the experiment's runs already existed" in result.md


def test_a_report_names_its_code_states_and_publish_refuses_mixed_or_uncommitted_runs(tmp_path, monkeypatch):
    experiment = experiment_with(tmp_path, [CLAIM])
    write_plan(experiment, PLAN.items(), ("model.d_k", "model.scale"))
    for i, cell in enumerate(c for c in experiment.cells):
        run_dir = experiment.directory / cell.name
        commit = "abc1234" if i % 2 else "def5678-dirty"
        runs.write_config(run_dir, to_dict(cell.config), {"attn_commit": commit})
    result = report_of(experiment, figures=False)
    assert result.data["code_states"] == {"abc1234": 10, "def5678-dirty": 10}
    note = result.data["code_state_note"]
    assert note == (
        "Not one clean commit: the runs come from 2 code states (abc1234: 10, def5678-dirty: 10); "
        "10 from uncommitted or unrecorded code (def5678-dirty)."
    )
    assert note in result.md

    repo = tmp_path / "repo"
    publish_into(repo, monkeypatch)
    run_dir = tmp_path / "pub" / "sqrt_dk"
    run_dir.mkdir(parents=True)
    runs.write_json(run_dir / "report.json", {**fake_report({"a": "confirmed"}), "code_state_note": note})
    with pytest.raises(publish.MixedCode) as caught:
        publish.publish(["sqrt_dk"], tmp_path / "pub")
    said = str(caught.value)
    assert said.startswith(f"{run_dir}: ") and "2 code states (abc1234: 10, def5678-dirty: 10)" in said
    assert "10 from uncommitted or unrecorded code (def5678-dirty)" in said and "re-run them" in said
    assert not (repo / "experiments" / "results").exists(), "nothing replaced"
    assert publish.publish(["sqrt_dk"], tmp_path / "pub", allow_mixed=True)
