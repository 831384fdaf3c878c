"""Issue 44 item 3: `attn runs` shows each run's outcome class and filters by it (`--outcome stalled`);
an older run without one in its summary is classified from its curve (attn.outcomes, one definition)."""

import json

import pytest
from helpers import TINY

from attn import cli
from attn.analysis import listing
from attn.config.loading import load_config
from attn.store import runs
from attn.train import lifecycle


def trained(tmp_path, name, *overrides):
    config = load_config(None, [*TINY, "train.steps=30", "logging.log_every=5", f"runs_dir={tmp_path}", *overrides])
    run_dir = lifecycle.create(config, name=name)
    lifecycle.execute(config, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A run that learns, one kept at chance (a zero rate: it never moves), and the latter again as an older
    run whose summary has no outcome."""
    root = tmp_path_factory.mktemp("runs")
    trained(root, "moves", "train.steps=200")  # TINY's rate
    trained(root, "still", "optim.lr=1e-12")
    older = trained(root, "older", "optim.lr=1e-12")
    summary = runs.read_summary(older)
    for key in ("outcome", "outcome_said", "outcome_detail"):
        summary.pop(key)
    runs.write_json(older / "summary.json", summary)
    return root


def test_every_ended_run_has_its_outcome_and_older_runs_are_classified_alike(root):
    rows = {row.name: row.outcome for row in listing.list_runs(root).rows}
    assert rows["still"] == rows["older"] == "stalled"
    assert rows["moves"] in ("learned", "learned then lost", "slow"), rows  # it left the plateau
    detail = json.loads((root / "still" / "summary.json").read_text())["outcome_detail"]
    assert detail["sat_at"] in ("chance", "no-retrieval") and detail["reached_step"] is None


def test_attn_runs_filters_by_outcome_and_shows_the_column(root, capsys):
    code = cli.main(["runs", str(root), "--outcome", "stalled"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[0].split()[:3] == ["name", "status", "outcome"]
    assert sorted(line.split()[0] for line in out[1:]) == ["older", "still"]


def test_an_unknown_outcome_is_refused_in_one_line(root, capsys):
    code = cli.main(["runs", str(root), "--outcome", "stuck"])
    err = capsys.readouterr().err
    assert code == 2 and "--outcome" in err and "stuck" in err and "Traceback" not in err
    with pytest.raises(Exception, match="outcome"):
        listing.list_runs(root, outcome="stuck")
