"""`attn verify --published`: a published report re-run, without its runs, by the commit it names
(attn.report.published), the git, make and verify steps faked: which run, where, in what order."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from helpers import facts_in
from test_publish import verifiable

from attn.experiment import verification, verify
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
    monkeypatch.setattr(published, "commit_id", lambda repo, commit, path: commit)  # its own tests use real git
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
    monkeypatch.undo()
    (tmp_path / "repo").mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    with pytest.raises(runs.RunError, match="has no commit 176b2c4"):
        published.verify_published(experiment, results, tmp_path / "repo", None, None, lambda message: None)
    assert children == []


def test_the_cli_verifies_a_published_report_through_it_and_refuses_it_with_as_run(tmp_path, monkeypatch, capsys):
    from attn import cli, publish

    experiment, results, _, _ = setup(tmp_path, monkeypatch, at_commit=True)
    asked = []
    monkeypatch.setattr(
        published,
        "verify_published",
        lambda experiment, results, repo, *args, judged_cells=False: (
            asked.append((experiment.name, results, repo, judged_cells))
            or {"agree": True, "files": [], "experiment": "w", "platforms": {"as run": {}}, "expectations": []}
        ),
    )
    monkeypatch.setattr(verification, "verify_markdown", lambda result: "compared")
    assert cli.main(["verify", str(tmp_path / "w.yaml"), "--published", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert asked == [("w", publish.RESULTS, publish.REPO, False)]
    assert cli.main(["verify", str(tmp_path / "w.yaml"), "--published", "--judged-cells"]) == 0
    assert asked[-1] == ("w", publish.RESULTS, publish.REPO, True)
    assert cli.main(["verify", str(tmp_path / "w.yaml"), "--published", "--as-run", "x"]) == 2
    assert facts_in(capsys.readouterr().err, "--published", "--as-run x")


# ---------------------------------------------------------------------------
# What a published report names, taken only as it can be (issue 46.5, 46.7)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "commit",
    [
        "HEAD~1^{/tiny|/../../../../../../../../../outside}",
        "main",
        "--upload-pack=touch x",
        "176B2C4",  # attn records lowercase hex
        "abc",  # shorter than git's shortest id
        "a" * 41,
        "f" * 5000,
    ],
    ids=["revision-expression", "branch", "option", "uppercase", "too-short", "41-hex", "5000-hex"],
)
def test_a_commit_that_is_not_a_hex_object_id_is_refused_cut_to_a_line(commit):
    with pytest.raises(runs.RunError) as info:
        published.published_commit({"code_states": {commit: 8}}, "r.json")
    assert facts_in(str(info.value), "r.json: code_states", "hex object id") and len(str(info.value)) < 300


@pytest.mark.parametrize("states", [5, "176b2c4", ["176b2c4"], {"176b2c4": "8"}, {"176b2c4": True}, None])
def test_code_states_that_is_not_a_mapping_of_counts_is_refused(states):
    with pytest.raises(runs.RunError) as info:
        published.published_commit({"code_states": states}, "r.json")
    assert facts_in(str(info.value), "r.json: code_states: got", "expected a mapping")


def test_a_long_code_state_is_shown_cut():
    with pytest.raises(runs.RunError) as info:
        published.published_commit({"code_states": {"a" * 5000 + "-dirty": 1, "b" * 5000: 2}}, "r.json")
    assert len(str(info.value)) < 400


def git(repo: Path, *arguments: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(["git", "-C", str(repo), *arguments], input=stdin, capture_output=True, check=True)
    return done.stdout.decode().strip()


def repo_with_commits(tmp_path: Path, messages: list[str]) -> tuple[Path, list[str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for message in messages:
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", message)
    return repo, git(repo, "rev-list", "--reverse", "HEAD").split()


def object_with_prefix(repo: Path, kind: str, prefix: str, content) -> str:
    """An object of `kind` whose id starts with `prefix` (content(n) tried for n = 0, 1, ...), written into repo."""
    n = 0
    while True:
        body = content(n).encode()
        oid = hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()
        if oid.startswith(prefix):
            assert git(repo, "hash-object", "-t", kind, "-w", "--stdin", stdin=body) == oid
            return oid
        n += 1


def test_a_commit_is_looked_up_among_object_ids_alone(tmp_path):
    repo, (first, second) = repo_with_commits(tmp_path, ["a", "b"])
    assert published.commit_id(repo, first[:7], "r.json") == first
    assert published.commit_id(repo, second, "r.json") == second
    object_with_prefix(repo, "blob", first[:4], lambda n: f"blob {n}")  # an object of another kind: no commit
    assert published.commit_id(repo, first[:4], "r.json") == first
    git(repo, "branch", second[:7], first)  # a branch named like a commit's id is not the commit it names
    assert published.commit_id(repo, second[:7], "r.json") == second
    tree = git(repo, "rev-parse", f"{first}^{{tree}}")
    twin = object_with_prefix(
        repo, "commit", first[:4], lambda n: f"tree {tree}\nauthor t <t@t> 0 +0000\ncommitter t <t@t> 0 +0000\n\n{n}\n"
    )
    with pytest.raises(runs.RunError) as info:
        published.commit_id(repo, first[:4], "r.json")
    assert facts_in(str(info.value), "r.json", first[:4], "2 commits")
    assert published.commit_id(repo, twin, "r.json") == twin
    with pytest.raises(runs.RunError, match="has no commit 0000000"):
        published.commit_id(repo, "0000000", "r.json")


def test_a_symbolic_link_where_the_worktree_goes_is_refused_not_followed(tmp_path, monkeypatch):
    experiment, results, children, verified = setup(tmp_path, monkeypatch, at_commit=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    published_dir = tmp_path / "runs" / "published"
    published_dir.mkdir(parents=True)
    for link in (published_dir / "176b2c4", published_dir):
        if link == published_dir:
            published_dir.rmdir()
        link.symlink_to(outside, target_is_directory=True)
        with pytest.raises(runs.RunError) as info:
            published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
        assert facts_in(str(info.value), str(link), "symbolic link")
        link.unlink()
    assert children == [] and verified == [] and list(outside.iterdir()) == []


def test_a_venv_made_in_part_is_removed_and_made_again_and_a_whole_one_kept(tmp_path, monkeypatch):
    experiment, results, children, _ = setup(tmp_path, monkeypatch, at_commit=False)
    tree = (tmp_path / "runs" / "published" / "176b2c4").resolve()
    (tree / ".venv" / "bin").mkdir(parents=True)  # a venv cut short: its python there, pip half made
    (tree / ".venv" / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    seen = []
    make = published.processes.run_child

    def run_child(command, cwd=None, stdout=None):
        if command[0] == "make":
            seen.append(sorted(p.name for p in (tree / ".venv").glob("*")) if (tree / ".venv").exists() else None)
            (tree / ".venv").mkdir(exist_ok=True)
            (tree / published.VENV_MARKER).touch()
        return make(command, cwd=cwd, stdout=stdout)

    monkeypatch.setattr(published.processes, "run_child", run_child)
    published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
    published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
    assert seen == [None, [".runtime"]], "the half-made venv removed before make; the whole one kept"


@pytest.mark.parametrize(
    "spoil",
    [
        lambda report: {**report, "code_states": 5},
        lambda report: {**report, "code_states": "176b2c4"},
        lambda report: {**report, "cells": "all"},
        lambda report: {**report, "cells": [{**report["cells"][0], "success_rate": None}]},
        lambda report: {**report, "expectations": [{"id": 3}]},
        lambda report: "truncated",
        lambda report: "not utf-8",
        lambda report: [report],
    ],
)
def test_verify_published_of_a_malformed_report_is_one_line_and_exit_2(spoil, tmp_path, monkeypatch, capsys):
    from attn import cli, publish

    experiment, results, children, verified = setup(tmp_path, monkeypatch, at_commit=False)
    path = results / "w" / runs.REPORT_FILE
    spoilt = spoil(json.loads(path.read_text()))
    if spoilt == "truncated":
        path.write_text(path.read_text()[:50])
    elif spoilt == "not utf-8":
        path.write_bytes(b"\xff\xfe{}")
    else:
        path.write_text(json.dumps(spoilt))
    monkeypatch.setattr(publish, "RESULTS", results)
    code = cli.main(["verify", str(tmp_path / "w.yaml"), "--published", "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and str(path) in err, err
    assert children == [] and verified == []


def test_a_runs_code_state_is_its_commits_hex_id_even_under_an_annotated_tag(tmp_path):
    from attn.train.lifecycle import source_revision

    repo, (commit,) = repo_with_commits(tmp_path, ["a"])
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "tag", "-a", "v1", "-m", "v1")
    state = source_revision(repo)
    assert published.HEX_ID.fullmatch(state) and commit.startswith(state)
    (repo / "new").write_text("x")
    git(repo, "add", "new")
    assert source_revision(repo) == f"{state}-dirty"
