"""`attn verify --published`: a published report re-run, without its runs, by the commit it names
(attn.report.published), the git, make and verify steps faked: which run, where, in what order."""

import subprocess

import pytest
from helpers import facts_in

from attn.experiment import verify
from attn.experiment.spec import load_experiment
from attn.report import published
from attn.store import runs


def test_only_a_report_of_one_clean_commit_names_a_commit_to_re_run():
    assert published.published_commit({"code_states": {"176b2c4": 1320}}, "r.json") == "176b2c4"
    for states, named in (({"176b2c4": 10, "ee88d54": 2}, ("176b2c4", "ee88d54")), ({"176b2c4-dirty": 3}, ("176b2c4-dirty",)),
                          ({}, ("no recorded code",))):
        with pytest.raises(runs.RunError) as info:
            published.published_commit({"code_states": states}, "r.json")
        assert facts_in(str(info.value), "r.json:", *named, "one clean commit")


def setup(tmp_path, monkeypatch, here: str):
    """An experiment whose report is published from commit 176b2c4, this checkout at `here`; the child
    steps and verify faked and recorded: (commands with their working directories, verify's calls)."""
    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    (tmp_path / "w.yaml").write_text("name: w\nbase: base.yaml\ngrid: {model.d_k: [8]}\nseeds: [0]\n")
    experiment = load_experiment(tmp_path / "w.yaml", runs_dir=str(tmp_path / "runs"))
    results = tmp_path / "results"
    (results / "w").mkdir(parents=True)
    runs.write_report_json(results / "w", {"code_states": {"176b2c4": 1}, "cells": [{"seeds": [{"seed": 0}]}]})
    children, verified = [], []

    def run_child(command, cwd=None, stdout=None):
        children.append((command, cwd))
        return subprocess.CompletedProcess(command, 1 if "verify" in command else 0)  # 1: a verdict differs

    def fake_verify(experiment, kernel, workers, progress, variants, as_run=None):
        verified.append((experiment.directory, as_run))
        out = experiment.directory.parent / "verify"
        out.mkdir(parents=True, exist_ok=True)
        for suffix in (".md", ".json"):
            (out / f"w{suffix}").write_text(f"compared{suffix}")
        return {"files": [str(out / "w.md"), str(out / "w.json")]}

    monkeypatch.setattr(published, "source_revision", lambda: here)
    monkeypatch.setattr(published.processes, "run_child", run_child)
    monkeypatch.setattr(verify, "verify", fake_verify)
    return experiment, results, children, verified


def test_at_the_commit_the_report_names_it_is_verified_here_with_the_published_report_as_run(tmp_path, monkeypatch):
    experiment, results, children, verified = setup(tmp_path, monkeypatch, "176b2c4")
    published.verify_published(experiment, results, tmp_path, None, 1, lambda message: None)
    assert children == [] and verified == [(experiment.directory, results / "w")]


def test_elsewhere_that_commit_re_runs_it_in_a_worktree_and_this_checkout_compares(tmp_path, monkeypatch):
    experiment, results, children, verified = setup(tmp_path, monkeypatch, "801168f")  # a later commit, or -dirty
    result = published.verify_published(experiment, results, tmp_path / "repo", "Sandybridge", 2, lambda message: None,
                                        ("float64", "kernel"))
    tree = (tmp_path / "runs" / "published" / "176b2c4").resolve()
    (command, _), (make, _), (old_verify, cwd) = children
    assert command[:6] == ["git", "-C", str(tmp_path / "repo"), "worktree", "add", "--detach"]
    assert command[-2:] == [str(tree), "176b2c4"]
    assert make == ["make", "-C", str(tree), ".venv/.runtime"]
    assert old_verify[0] == str(tree / ".venv" / "bin" / "python") and cwd == tree
    assert old_verify[2:] == ["attn", "verify", "experiments/w.yaml", "--runs-dir", "runs", "--kernel=Sandybridge",
                              "--workers=2", "--variants=float64,kernel"]
    assert sorted(p.name for p in (tree / "runs" / "w").iterdir()) == [runs.REPORT_FILE, runs.SEEDS_FILE]
    assert verified == [(tree / "runs" / "w", results / "w")], "compared here, of the worktree's runs"
    assert result["files"] == [str(tmp_path / "runs" / "verify" / "w.md"), str(tmp_path / "runs" / "verify" / "w.json")]
    assert (tmp_path / "runs" / "verify" / "w.json").read_text() == "compared.json"
    children.clear()
    (tree / ".git").write_text("gitdir: elsewhere\n")  # made by the first call: a resume adds no worktree
    published.verify_published(experiment, results, tmp_path / "repo", None, None, lambda message: None)
    assert [c[0][0] for c in children] == ["make", str(tree / ".venv" / "bin" / "python")]


def test_a_step_that_fails_stops_it_with_the_command_named(tmp_path, monkeypatch):
    experiment, results, children, _ = setup(tmp_path, monkeypatch, "801168f")
    monkeypatch.setattr(published.processes, "run_child",
                        lambda command, cwd=None, stdout=None: subprocess.CompletedProcess(command, 2))
    with pytest.raises(runs.RunError) as info:
        published.verify_published(experiment, results, tmp_path, None, None, lambda message: None)
    assert facts_in(str(info.value), "git -C", "worktree add", "exit 2")
