"""`attn verify --published`: a published report re-run, without its runs, by the commit it names
(attn.report.published), the git, make and verify steps faked: which run, where, in what order."""

import subprocess
from pathlib import Path

import pytest
from helpers import facts_in
from test_publish import verifiable

from attn.experiment import verify
from attn.experiment.spec import load_experiment
from attn.report import published
from attn.store import runs


def test_only_a_report_of_one_clean_commit_names_a_commit_to_re_run():
    assert published.published_commit({"code_states": {"176b2c4": 1320}}, "r.json") == "176b2c4"
    for states, named in (
        ({"176b2c4": 10, "ee88d54": 2}, ("176b2c4", "ee88d54")),
        ({"176b2c4-dirty": 3}, ("176b2c4-dirty",)),
        ({}, ("no recorded code",)),
    ):
        with pytest.raises(runs.RunError) as info:
            published.published_commit({"code_states": states}, "r.json")
        assert facts_in(str(info.value), "r.json:", *named, "one clean commit")


def setup(tmp_path, monkeypatch, at_commit: bool, runs_dir: str | None = None):
    """An experiment whose report is published from commit 176b2c4, this checkout at it (clean) or not;
    git's answers, the child steps and verify faked and recorded: (commands with their working
    directories, verify's calls)."""
    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    (tmp_path / "w.yaml").write_text("name: w\nbase: base.yaml\ngrid: {model.d_k: [8]}\nseeds: [0]\n")
    experiment = load_experiment(tmp_path / "w.yaml", runs_dir=runs_dir or str(tmp_path / "runs"))
    results = tmp_path / "results"
    (results / "w").mkdir(parents=True)
    runs.write_report_json(results / "w", {**verifiable(experiment, {"a": "confirmed"}), "code_states": {"176b2c4": 1}})
    children, verified = [], []

    def run_child(command, cwd=None, stdout=None):
        children.append((command, cwd))
        if "verify" in command:  # that commit's verify: its comparison written, a verdict differs
            (Path(cwd) / "runs" / "verify").mkdir(parents=True, exist_ok=True)
            (Path(cwd) / "runs" / "verify" / "w.json").write_text("{}")
            return subprocess.CompletedProcess(command, 1)
        if command[:2] == ["git", "-C"]:
            Path(command[-2]).mkdir(parents=True)
        return subprocess.CompletedProcess(command, 0)

    def fake_verify(experiment, kernel, workers, progress, variants, as_run=None, made=False):
        verified.append((experiment.directory, as_run, made))
        out = experiment.directory.parent / "verify"
        out.mkdir(parents=True, exist_ok=True)
        for suffix in (".md", ".json"):
            (out / f"w{suffix}").write_text(f"compared{suffix}")
        return {"files": [str(out / "w.md"), str(out / "w.json")]}

    monkeypatch.setattr(published, "_at", lambda where, commit: at_commit or Path(where).name == commit)
    monkeypatch.setattr(published, "_git_ok", lambda arguments, where: True)
    monkeypatch.setattr(published.processes, "run_child", run_child)
    monkeypatch.setattr(verify, "verify", fake_verify)
    return experiment, results, children, verified


def test_at_the_commit_the_report_names_it_is_verified_here_with_the_published_report_as_run(tmp_path, monkeypatch):
    experiment, results, children, verified = setup(tmp_path, monkeypatch, at_commit=True)
    published.verify_published(experiment, results, tmp_path, None, 1, lambda message: None)
    assert children == [] and verified == [(experiment.directory, results / "w", False)]


def test_elsewhere_that_commit_re_runs_it_in_a_worktree_and_this_checkout_compares(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment, results, children, verified = setup(tmp_path, monkeypatch, at_commit=False, runs_dir="runs")
    result = published.verify_published(
        experiment, results, tmp_path / "repo", "Sandybridge", 2, lambda message: None, ("float64", "kernel")
    )
    tree = (tmp_path / "runs" / "published" / "176b2c4").resolve()
    (command, _), (make, _), (old_verify, cwd) = children
    assert command == ["git", "-C", str(tmp_path / "repo"), "worktree", "add", "--detach", str(tree), "176b2c4"]
    assert make == ["make", "-C", str(tree), ".venv/.runtime"]
    assert Path(old_verify[0]).is_absolute() and old_verify[0] == str(tree / ".venv" / "bin" / "python") and cwd == tree
    assert old_verify[2:] == [
        "attn",
        "verify",
        "experiments/w.yaml",
        "--runs-dir",
        "runs",
        "--kernel=Sandybridge",
        "--workers=2",
        "--variants=float64,kernel",
    ]
    assert sorted(p.name for p in (tree / "runs" / "w").iterdir()) == [runs.REPORT_FILE, runs.SEEDS_FILE]
    assert verified == [(tree / "runs" / "w", results / "w", True)], "its re-runs compared here as they are"
    assert result["files"] == [str(Path("runs") / "verify" / "w.md"), str(Path("runs") / "verify" / "w.json")]
    assert (tmp_path / "runs" / "verify" / "w.json").read_text() == "compared.json"
    children.clear()
    published.verify_published(experiment, results, tmp_path / "repo", None, None, lambda message: None)
    assert [c[0][0] for c in children] == ["make", str(tree / ".venv" / "bin" / "python")], "a resume adds no worktree"


def test_a_step_that_fails_stops_it_with_the_step_named(tmp_path, monkeypatch):
    experiment, results, children, _ = setup(tmp_path, monkeypatch, at_commit=False)
    for code, step in ((2, "its worktree"), (1, "its worktree")):  # exit 1 is a failure but for its verify's
        monkeypatch.setattr(
            published.processes,
            "run_child",
            lambda command, cwd=None, stdout=None: subprocess.CompletedProcess(command, code),
        )
        with pytest.raises(runs.RunError) as info:
            published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
        assert facts_in(str(info.value), step, "worktree add", f"exited {code}")


def test_its_verify_exiting_1_without_a_comparison_failed(tmp_path, monkeypatch):
    """A traceback exits 1 too: only a verify that wrote its comparison has verdicts that differ."""
    experiment, results, children, verified = setup(tmp_path, monkeypatch, at_commit=False)
    tree = (tmp_path / "runs" / "published" / "176b2c4").resolve()
    (tree / "runs" / "verify").mkdir(parents=True)
    (tree / "runs" / "verify" / "w.json").write_text("{} from an earlier verify")
    monkeypatch.setattr(
        published.processes,
        "run_child",
        lambda command, cwd=None, stdout=None: subprocess.CompletedProcess(command, 1 if cwd else 0),
    )
    with pytest.raises(runs.RunError) as info:
        published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
    assert facts_in(str(info.value), "its attn verify (at 176b2c4) failed", "exited 1") and verified == []


def test_a_place_that_is_not_that_commits_worktree_or_a_clone_without_it_is_refused(tmp_path, monkeypatch):
    experiment, results, children, _ = setup(tmp_path, monkeypatch, at_commit=False)
    tree = tmp_path / "runs" / "published" / "176b2c4"
    tree.mkdir(parents=True)
    monkeypatch.setattr(published, "_at", lambda where, commit: False)
    with pytest.raises(runs.RunError, match="exists but is not a checkout of 176b2c4"):
        published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
    monkeypatch.setattr(published, "_git_ok", lambda arguments, where: arguments[0] != "cat-file")
    with pytest.raises(runs.RunError, match="has no commit 176b2c4"):
        published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
    assert children == []


def test_the_cli_verifies_a_published_report_through_it_and_refuses_it_with_as_run(tmp_path, monkeypatch, capsys):
    from attn import cli, publish

    experiment, results, _, _ = setup(tmp_path, monkeypatch, at_commit=True)
    asked = []
    monkeypatch.setattr(
        published,
        "verify_published",
        lambda experiment, results, repo, *args: (
            asked.append((experiment.name, results, repo))
            or {"agree": True, "files": [], "experiment": "w", "platforms": {"as run": {}}, "expectations": []}
        ),
    )
    monkeypatch.setattr(verify, "verify_markdown", lambda result: "compared")
    assert cli.main(["verify", str(tmp_path / "w.yaml"), "--published", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert asked == [("w", publish.RESULTS, publish.REPO)]
    assert cli.main(["verify", str(tmp_path / "w.yaml"), "--published", "--as-run", "x"]) == 2
    assert facts_in(capsys.readouterr().err, "--published", "--as-run x")
