"""A published result re-run on this machine, without its runs, from the commit its report names.

    attn verify experiments/<name>.yaml --published      (make verify-published EXP=<name>)

A published report (experiments/results/<name>/report.json) comes from one
clean commit, which it records (attn publish refuses others). Its re-runs
must be made by that code, or a verdict that flips could come from a change
to the code as much as from rounding. So, unless this checkout is that
commit, clean: a git worktree of it under runs/published/<commit>/, with its
own .venv from its own pinned requirements (`make .venv/.runtime` there),
the published report copied in as its experiment's own (runs/<name>/: the
report and its seeds file, no runs), and that commit's `attn verify` of it,
in a child process; its materialized re-run, finding no runs to link, makes
them as they ran. Then this checkout sets that commit's re-runs, as its
reports have them, beside the published report (attn.experiment.verify,
`made`) and writes runs/verify/<name>.md and .json here, which `attn
publish <name> --verification-only` puts beside the report. Stopped, it
resumes: the worktree, its venv and every finished re-run are kept.

The commit is taken only as a hex object id, looked up among git's object
ids alone, before git sees it (never as a revision expression, a ref or a
path); runs/published/ and runs/published/<commit>/ are never symbolic links
(refused, not followed). A .venv whose making was cut short (a Ctrl-C, a
full disk) lacks the .venv/.runtime that make touches last: it is removed
and made again, never trusted.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from attn.config.yamlio import show_value
from attn.experiment import verify
from attn.experiment.spec import Experiment, load_experiment
from attn.experiment.verification import VARIANTS
from attn.report import judged_cells as judged
from attn.report.experiment_report import is_clean_state
from attn.store import processes, runs

HEX_ID = re.compile(r"[0-9a-f]{4,40}")  # a commit as attn records it: its object id, whole or a prefix
VENV_MARKER = ".venv/.runtime"  # the make target that makes a checkout's .venv, touched once it is whole


def published_commit(report: dict, path: Path) -> str:
    """The one clean commit a published report's runs came from, as its code_states names it: a hex
    object id (4 to 40 hex digits), nothing git would read as a revision expression or a path;
    RunError when there is not one."""
    states = report.get("code_states")
    if not isinstance(states, dict) or not all(
        isinstance(count, int) and not isinstance(count, bool) for count in states.values()
    ):
        raise runs.RunError(
            f"{path}: code_states: got {show_value(states)}; expected a mapping of each code state the runs "
            "were made with to its number of runs, e.g. {176b2c4: 1320}"
        )
    if len(states) != 1 or not is_clean_state(next(iter(states))):
        named = ", ".join(show_value(state) for state in list(states)[:3]) + (", ..." if len(states) > 3 else "")
        raise runs.RunError(
            f"{path}: its runs come from {named or 'no recorded code'}; only a report of "
            "one clean commit can be re-run from the commit it names"
        )
    commit = next(iter(states))
    if not HEX_ID.fullmatch(commit):
        raise runs.RunError(
            f"{path}: code_states: got the commit {show_value(commit)}; expected its hex object id "
            "(4 to 40 of 0-9a-f, as attn records it)"
        )
    return commit


def verify_published(
    experiment: Experiment,
    results: Path,
    repo: Path,
    kernel: str | None,
    workers: int | None,
    progress: Callable[[str], None],
    variants: tuple[str, ...] = VARIANTS,
    judged_cells: bool = False,
) -> dict:
    """Verify the report published in results/<name> from the commit it names (module docstring); the
    comparison, as attn.experiment.verify.verify returns it, its files written under this checkout's runs/.
    `judged_cells`: the materialized re-run of the cells its claims are judged at, alone
    (attn.report.judged_cells), its runs made by that commit's `attn sweep` and `attn report`."""
    published = Path(results) / experiment.name
    commit = published_commit(runs.read_report_json(published), published / runs.REPORT_FILE)
    verify.checked_report(experiment, published, "as published")  # its claims this file's, before hours of work
    object_id = commit_id(repo, commit, published / runs.REPORT_FILE)
    if _at(repo, object_id) and _git_ok(["diff", "--quiet", "HEAD", "--"], repo):  # that commit, clean
        if judged_cells:
            return judged.verify_judged(experiment, workers, progress, as_run=published)
        return verify.verify(experiment, kernel, workers, progress, variants, as_run=published)
    runs_dir = Path(experiment.cells[0].config.runs_dir)
    place = runs_dir / "published" / commit
    for part in (place.parent, place, place / ".venv"):
        if part.is_symlink():
            raise runs.RunError(
                f"{part}: is a symbolic link; attn makes that commit's worktree and its .venv only in real "
                f"directories under {runs_dir} (remove the link, then run the same command again)"
            )
    tree = place.resolve()  # absolute: its children run there
    if not tree.exists():
        _run("its worktree", ["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), object_id], progress)
    elif not _at(tree, object_id):
        raise runs.RunError(f"{tree}: exists but is not a checkout of {commit}; remove it (git worktree remove)")
    whole_venv(tree, progress)
    copied = tree / "runs" / experiment.name
    copied.mkdir(parents=True, exist_ok=True)
    for name in (runs.REPORT_FILE, runs.SEEDS_FILE):
        if (published / name).exists():
            shutil.copyfile(published / name, copied / name)
    if judged_cells:
        there = load_experiment(experiment.path, runs_dir=str(tree / "runs"))
        python = [str(tree / ".venv" / "bin" / "python")]
        result = judged.verify_judged(
            there, workers, progress, as_run=published, attn=(python, tree, f"experiments/{experiment.name}.yaml")
        )
        return _copied_here(result, runs_dir)
    its_verification = tree / "runs" / "verify" / f"{experiment.name}.json"
    its_verification.unlink(missing_ok=True)  # written anew by its verify, which exits 1 when a verdict differs
    options = (
        ([f"--kernel={kernel}"] if kernel else [])
        + ([f"--workers={workers}"] if workers else [])
        + ([f"--variants={','.join(variants)}"] if tuple(variants) != VARIANTS else [])
    )
    _run(
        f"its attn verify (at {commit})",
        [
            str(tree / ".venv" / "bin" / "python"),
            "-m",
            "attn",
            "verify",
            f"experiments/{experiment.name}.yaml",
            "--runs-dir",
            "runs",
            *options,
        ],
        progress,
        cwd=tree,
        verdicts_differ=its_verification,
    )
    there = load_experiment(experiment.path, runs_dir=str(tree / "runs"))
    result = verify.verify(there, kernel, workers, progress, variants, as_run=published, made=True)
    return _copied_here(result, runs_dir)


def _copied_here(result: dict, runs_dir: Path) -> dict:
    """The comparison with its files copied from the worktree into this checkout's runs/verify."""
    here = runs_dir / "verify"
    here.mkdir(parents=True, exist_ok=True)
    result["files"] = [str(shutil.copyfile(path, here / Path(path).name)) for path in result["files"]]
    return result


def whole_venv(tree: Path, progress: Callable[[str], None]) -> None:
    """tree/.venv made by that commit's own Makefile (`make .venv/.runtime`), whole: a .venv without the
    .venv/.runtime that make touches last was cut short (a Ctrl-C, a full disk) and is removed first, as
    that commit's Makefile may trust any .venv with a python in it."""
    marker = tree / VENV_MARKER
    if marker.parent.exists() and not marker.exists():
        progress(f"{marker.parent}: not made whole (no {marker.name}): removed, to be made again")
        shutil.rmtree(marker.parent)
    _run("its .venv", ["make", "-C", str(tree), VENV_MARKER], progress)


def commit_id(repo: Path, commit: str, path: Path) -> str:
    """The whole object id of the one commit of `repo` whose id starts with `commit` (hex, published_commit),
    looked up among object ids alone (never a ref or a revision expression); RunError when there is none,
    or more than one."""
    found = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", f"--disambiguate={commit}"], capture_output=True, text=True, timeout=60
    )
    objects = found.stdout.split() if found.returncode == 0 else []
    typed = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch-check=%(objecttype) %(objectname)"],
        input="".join(f"{oid}\n" for oid in objects),
        capture_output=True,
        text=True,
        timeout=60,
    )
    commits = [line.split()[1] for line in typed.stdout.splitlines() if line.startswith("commit ")]
    if not commits:
        raise runs.RunError(f"{repo}: has no commit {commit}, which {path} names (a shallow clone?); fetch it first")
    if len(commits) > 1:
        raise runs.RunError(
            f"{path}: names commit {commit}, which is the start of {len(commits)} commits of {repo}; "
            "expected the id of one"
        )
    return commits[0]


def _git_ok(arguments: list[str], where: Path) -> bool:
    """Whether git, run in `where`, exits 0."""
    return subprocess.run(["git", "-C", str(where), *arguments], capture_output=True, timeout=60).returncode == 0


def _at(where: Path, object_id: str) -> bool:
    """Whether the checkout at `where` has the commit of that whole object id checked out."""
    head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60)
    return head.returncode == 0 and head.stdout.strip() == object_id


def _run(
    step: str,
    command: list[str],
    progress: Callable[[str], None],
    cwd: Path | None = None,
    verdicts_differ: Path | None = None,
) -> None:
    """A step of verify_published, in a child process stopped with this one, its messages on this one's
    stderr; RunError naming the step on failure. Exit 1 of that commit's verify says a verdict differs
    (`verdicts_differ`: the comparison it then wrote; without it, exit 1 is a failure too)."""
    progress(" ".join(command) + (f"  (in {cwd})" if cwd else ""))
    done = processes.run_child(command, cwd=cwd, stdout=2)
    if done.returncode != 0 and not (done.returncode == 1 and verdicts_differ is not None and verdicts_differ.exists()):
        raise runs.RunError(
            f"verify: {step} failed: `{' '.join(command)}` exited {done.returncode} (its messages "
            "are above); run the same command again to resume"
        )
