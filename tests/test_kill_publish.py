"""`attn publish` killed at each of its durable writes in turn (as
tests/test_kill_every_write.py does for runs): the published tree is then
the old set or the new one, never a mix: experiments/results/ as a whole
is one or the other, each README is whole, a README is new only once the
results it links are; and the next publish finishes the job, leaving
nothing of the killed one behind. make test-slow kills at a sample of the
writes (one in the middle, the last before the swap, the swap,
experiments/README.md);
make test-faults at every one.

Two publishes at once, as real processes: one publishes, the other is
refused in one line naming the first (experiments/'s lock), and nothing
published is lost. make test-slow runs one race and a publish refused while
another process holds the lock; make test-faults twenty races.
"""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import facts_in, verification, write_experiment_file

from attn import publish, results_text
from attn.experiment import verify
from attn.store import runs

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
ENV.pop(runs.KILL_AFTER_WRITES, None)
PUBLISH = (
    "import sys; from pathlib import Path; from attn import publish; repo = Path(sys.argv[1]); "
    "publish.REPO, publish.RESULTS = repo, repo / 'experiments' / 'results'; "
    "publish.publish(None, Path(sys.argv[2]))"
)
PUBLISH_CLI = """
import sys
from pathlib import Path
from attn import cli
from attn.train import denormals
with denormals.flushing(False):  # as the CLI imports it
    from attn import publish
repo = Path(sys.argv[1])
publish.REPO, publish.RESULTS = repo, repo / "experiments" / "results"
sys.exit(cli.main(["publish", "--runs-dir", sys.argv[2]]))
"""  # `attn publish --runs-dir RUNS` in the repository given
HOLD_LOCK = (  # experiments/'s lock held, as a publish holds it, until stdin closes
    "import sys; from pathlib import Path; from attn.store import locks; "
    "lock = locks.RunLock(Path(sys.argv[1]) / 'experiments', 'publish'); lock.__enter__(); "
    "print('held', flush=True); sys.stdin.read()"
)


def report(headline: str, verdict: str) -> dict:
    return {
        "description": "what it tests",
        "runs": 4,
        "headline": headline,
        "platform": {"attn_commit": ["abc1234"], "cpu": ["a CPU"], "blas": ["openblas"], "dtype": ["float32"]},
        "expectations": [{"id": "a", "claim": "claim a", "verdict": verdict}],
    }


def make_runs(root: Path, version: str, figures: tuple[str, ...]) -> Path:
    """runs/ with reports of sqrt_dk and scores (their figures named), a verification and a benchmark."""
    for name in ("sqrt_dk", "scores"):
        run_dir = root / name
        run_dir.mkdir(parents=True)
        made = report(f"{name} paragraph, {version}.", "confirmed")  # of the same seeds and claims, run at another time
        made["claims"] = {"digest": "d1", "frozen_at": f"2026-12-0{1 if version == 'old' else 2}T00:00:00Z"}
        runs.write_json(run_dir / "report.json", made)
        (run_dir / "report.md").write_text(f"# {name} {version}\n")
        (run_dir / "report.csv").write_text(f"cell,{version}\n")
        for figure in figures:
            (run_dir / f"{figure}.png").write_bytes(b"\x89PNG " + version.encode() * 1000)
    (root / "verify").mkdir()
    (root / "verify" / "sqrt_dk.md").write_text(f"verified {version}\n")
    runs.write_json(
        root / "verify" / "sqrt_dk.json",
        {
            **verification({"float64": "confirmed", "Sandybridge": version}, experiment="sqrt_dk"),
            "as_run": verify.as_run_record(root / "sqrt_dk" / "report.json", False),
        },
    )
    return root


def tree(repo: Path) -> dict[str, dict[str, bytes]]:
    """What is published: experiments/results/ as a whole, and each README (hidden staging left out)."""
    results = repo / "experiments" / "results"
    return {
        "results": {str(p.relative_to(results)): p.read_bytes() for p in sorted(results.rglob("*")) if p.is_file()},
        "experiments/README.md": (repo / "experiments" / "README.md").read_bytes(),
        "README.md": (repo / "README.md").read_bytes(),
    }


def run_publish(repo: Path, runs_dir: Path, kill_after: int | None = None) -> subprocess.Popen:
    env = ENV if kill_after is None else {**ENV, runs.KILL_AFTER_WRITES: str(kill_after)}
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISH, str(repo), str(runs_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A repository published from the old runs; the new runs; the old and new trees; how many writes publish makes."""
    root = tmp_path_factory.mktemp("publish")
    old_repo = root / "old"
    (old_repo / "experiments").mkdir(parents=True)
    for name in ("sqrt_dk", "scores"):
        write_experiment_file(old_repo, name)
    (old_repo / "README.md").write_text(
        f"# attn\n\n{results_text.RESULTS_BEGIN}\nnone yet\n{results_text.RESULTS_END}\n\n"
        f"{results_text.BENCH_BEGIN}\nnone yet\n{results_text.BENCH_END}\n"
    )
    (old_repo / "experiments" / "results").mkdir()
    (old_repo / "experiments" / "results" / "board.png").write_bytes(b"kept as it is")
    old_runs = make_runs(root / "runs-old", "old", ("headline", "lr_sensitivity", "dropped"))
    assert run_publish(old_repo, old_runs).wait(timeout=60) == 0
    new_runs = make_runs(root / "runs-new", "new", ("headline", "lr_sensitivity", "added"))
    new_runs.joinpath("bench").mkdir()
    from test_publish import bench_result  # noqa: PLC0415

    runs.write_json(new_runs / "bench" / "bench-20261201-100000.json", bench_result(0.6, 1.0))
    (new_runs / "bench" / "bench-20261201-100000.md").write_text("# bench\n")
    new_repo = root / "new"
    shutil.copytree(old_repo, new_repo)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv(runs.KILL_AFTER_WRITES, str(10**9))
        monkeypatch.setattr(runs, "_writes_done", 0)
        monkeypatch.setattr(publish, "REPO", new_repo)
        monkeypatch.setattr(publish, "RESULTS", new_repo / "experiments" / "results")
        publish.publish(None, new_runs)
        writes = runs._writes_done
    old, new = tree(old_repo), tree(new_repo)
    assert old != new and all(old[part] != new[part] for part in old)
    assert "dropped.png" not in str(new["results"]) and "scores/added.png" in new["results"]
    assert new["results"]["board.png"] == b"kept as it is"
    assert "sqrt_dk/history.json" in new["results"] and "sqrt_dk/history.json" not in old["results"]
    return root, old_repo, new_runs, old, new, writes


def kill_at(published, points) -> None:
    root, old_repo, new_runs, old, new, writes = published
    repos = {k: root / f"killed-{k}" for k in points}
    for repo in repos.values():
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(old_repo, repo)
    started = {k: run_publish(repo, new_runs, kill_after=k) for k, repo in repos.items()}
    for k, process in started.items():
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == -signal.SIGKILL, (k, stderr)
    for k, repo in repos.items():
        found = tree(repo)
        for part in found:
            assert found[part] in (old[part], new[part]), f"killed after write {k}: {part} is a mix"
        if found["experiments/README.md"] == new["experiments/README.md"] or found["README.md"] == new["README.md"]:
            assert found["results"] == new["results"], f"killed after write {k}: a README links results not there"
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(publish, "REPO", repo)
            monkeypatch.setattr(publish, "RESULTS", repo / "experiments" / "results")
            publish.publish(None, new_runs)
        assert tree(repo) == new, f"killed after write {k}: publish again does not finish it"
        assert [p.name for p in (repo / "experiments").iterdir() if p.name.startswith(".") and p.name != ".lock"] == []
        assert not list(repo.rglob("*.tmp"))


@pytest.mark.slow
def test_publish_killed_at_a_sample_of_its_writes_leaves_the_old_or_the_new_set(published):
    writes = published[-1]
    swap = writes - 2  # then experiments/README.md, then README.md
    kill_at(published, sorted({swap // 2, swap - 1, swap, writes - 1}))


@pytest.mark.faults
def test_publish_killed_at_every_one_of_its_writes_leaves_the_old_or_the_new_set(published):
    kill_at(published, range(1, published[-1] + 1))


def publish_cli(repo: Path, runs_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISH_CLI, str(repo), str(runs_dir)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def race(published, trials: int) -> None:
    """Two `attn publish` of the new runs at once on a copy of the old repository, `trials` times: each exits
    0, or 2 with one line naming the publish holding the lock; the new set is published whole, nothing of
    the old one is lost on the way, and nothing of either is left beside it."""
    root, old_repo, new_runs, old, new, writes = published
    repo = root / "race"
    for trial in range(trials):
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(old_repo, repo)
        first, second = publish_cli(repo, new_runs), publish_cli(repo, new_runs)
        outcomes = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in (first, second)]
        assert sorted(code for code, _, _ in outcomes) in ([0, 0], [0, 2]), (trial, outcomes)
        for code, _, err in outcomes:
            if code == 2:
                assert err.count("\n") == 1 and facts_in(err, "experiments: in use by attn publish (pid"), trial
        assert tree(repo) == new, f"trial {trial}: two publishes at once left another set than one publish"
        assert [p.name for p in (repo / "experiments").iterdir() if p.name.startswith(".") and p.name != ".lock"] == []


@pytest.mark.slow
def test_two_publishes_at_once_publish_one_set_and_lose_nothing(published):
    race(published, trials=1)


@pytest.mark.faults
def test_two_publishes_at_once_twenty_times_publish_one_set_and_lose_nothing(published):
    race(published, trials=20)


@pytest.mark.slow
def test_a_publish_is_refused_in_one_line_while_another_process_holds_the_publish_lock(published):
    root, old_repo, new_runs, old, new, writes = published
    repo = root / "held"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(old_repo, repo)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(repo)], env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        refused = publish_cli(repo, new_runs)
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 2 and err.count("\n") == 1
        assert facts_in(err, f"{repo / 'experiments'}: in use by attn publish (pid {holder.pid} ")
        assert tree(repo) == old, "a refused publish touches nothing"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert publish_cli(repo, new_runs).wait(timeout=120) == 0 and tree(repo) == new
