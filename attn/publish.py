"""Results published: reports, verifications and the newest benchmark copied into experiments/results/ whole,
and the text made from them (attn.results_text) written into experiments/README.md and README.md.

    attn publish [NAME ...]        (make publish)
    attn publish --text-only       (the text alone, from what is published)
    attn publish --bench           (the newest benchmark, and the text)

For each experiment with a report in runs/<name>/ (default: every
experiments/*.yaml that has one): its report, CSV, JSON and figures are
copied to experiments/results/<name>/ (committed), with its verification
(runs/verify/<name>.md and .json) where `attn verify` made one. Then
experiments/README.md is written afresh from those report.json and verify.json
files (attn.results_text.experiments_readme), and README.md's block between
RESULTS_BEGIN and RESULTS_END is replaced by results_block. The newest
benchmark (runs/bench/bench-<time>.json, from `attn bench`) is copied to
experiments/results/bench.json and .md, and its short form (bench_block)
fills README's block between BENCH_BEGIN and BENCH_END; `bench_only`
publishes that benchmark with no report, the text written afresh from the
results already published (as publish_text writes it). A benchmark, like a report, is
published from one clean commit: one of uncommitted code (`attn bench`
records `git describe --dirty`) or of no known commit is refused unless
allow_mixed. Nothing in any of them is typed by hand.

Atomic: the new experiments/results/ is built beside the old one
(experiments/.results.new: every file it keeps hard-linked, every file it
changes written with fsync), then swapped in with one atomic exchange of
the two directories (renameat2 RENAME_EXCHANGE; where the system lacks it,
two renames, and a publish that finds results/ missing beside
.results.old puts the old one back first); experiments/README.md and
README.md are written last, each atomically. A kill at any moment leaves
the old published set or the new one, never a directory of both, a torn
file or a file deleted before its replacement is in place; the next
publish removes what a killed one left beside them.

One publish at a time (experiments/'s RunLock): a second is refused in one
line, never left to remove the first's staging. Before anything is staged,
every file it reads is checked (each report.json, verify.json and benchmark,
in runs/ and published: JSON of the fields the text is made from, regular
files only; experiments/results/ holding no symbolic link), and a damaged one
is named in one line; attn.results_text makes every string of them
markdown_safe before it generates any text.

A verification goes only beside the report it verified (the digest its
record keeps, attn.experiment.verify.report_digest): publish refuses, before
it touches anything, one of another report. A report published again, byte
for byte or of the digest its published verification names, keeps it.
`--verification-only` writes the verifications alone beside the reports already published, for a
published report verified without its runs (attn verify --as-run or
--published), each with the re-runs of the one published before that it
did not make, where that one verified the same report.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import stat
from pathlib import Path

from attn.analysis.verdicts import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED
from attn.bench import device_gains
from attn.experiment import verify
from attn.experiment.verification import merge, reruns_in_order, verify_markdown
from attn.results_text import (
    BENCH_BEGIN,
    BENCH_END,
    DEVICES_BEGIN,
    DEVICES_END,
    HEADLINE,
    RESULTS_BEGIN,
    RESULTS_END,
    bench_block,
    experiments_readme,
    markdown_safe,
    results_block,
    shortened,
    shown,
    unclean_reruns,
    with_block,
)
from attn.store import locks, runs

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "experiments" / "results"
BENCH_DOC = REPO / "docs" / "bench.md"
COPIED = ("report.md", runs.REPORT_FILE, runs.SEEDS_FILE, "report.csv", "*.png")
HISTORY_FILE = "history.json"  # in results/<name>/: the runs published before of the same seeds and claims


class MixedCode(runs.RunError):
    """Results made by code other than one clean commit: published only when the caller allows mixed code."""


def publish(
    names: list[str] | None = None,
    runs_dir: Path = REPO / "runs",
    allow_mixed: bool = False,
    verification_only: bool = False,
    bench_only: bool = False,
) -> list[Path]:
    """Copy each experiment's report into experiments/results/ and regenerate
    experiments/README.md and README.md's results block; the paths written.
    Refused (RunError, one line) for a report whose runs come from several
    code states or from uncommitted code (its code_state_note), or a
    verification whose re-runs did (unclean_reruns), unless allow_mixed; the
    text says so either way; for a verification of another report than the one
    it would be published beside; while another publish runs (_publishing);
    and for any file it reads that it cannot make its text from. A
    verification is written through merge with the one published before
    (_write_verification). `verification_only`: each one's verification alone,
    beside the report already published, which it must have verified.
    `bench_only`: the newest benchmark alone (module docstring)."""
    runs_dir = Path(runs_dir)
    with _publishing():
        _recover(RESULTS)
        _check_results_tree(RESULTS)
        if bench_only:
            bench = _newest_bench(runs_dir, allow_mixed)
            if bench is None:
                raise runs.RunError(f"{runs_dir / 'bench'}: no benchmark yet; run `attn bench` first")
            _check_published(RESULTS, replaced=(), bench_replaced=True)
            return _publish_staged({}, runs_dir, bench, copy_reports=False)
        return _publish_checked(names, runs_dir, allow_mixed, verification_only)


def _publish_checked(names: list[str] | None, runs_dir: Path, allow_mixed: bool, verification_only: bool) -> list[Path]:
    """publish's work for experiments, its lock held: every source checked, then _publish_staged."""
    experiments = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml"))
    unknown = [name for name in names or () if name not in experiments]
    if unknown:  # a name is a directory of the results: only an experiment's, never a path
        raise runs.RunError(
            f"publish: NAME {shown(unknown[0])!r}: not an experiment; expected one of {', '.join(experiments)}"
        )
    verifications = {
        name: {suffix: runs_dir / "verify" / f"{name}{suffix}" for suffix in (".md", ".json")} for name in experiments
    }
    reports = {name: (RESULTS if verification_only else runs_dir) / name / runs.REPORT_FILE for name in experiments}
    names = names or [
        name
        for name in experiments
        if reports[name].exists() and (not verification_only or verifications[name][".json"].exists())
    ]
    if not names:
        raise runs.RunError(
            f"{runs_dir}: no verification of a published report yet; run `attn verify "
            "experiments/<name>.yaml` with the published report as run first"
            if verification_only
            else f"{runs_dir}: no experiment has a report yet; run `attn sweep experiments/<name>.yaml` first"
        )
    for name in names:  # every source checked before any result is replaced
        if not reports[name].exists():
            raise runs.RunError(
                f"{reports[name]}: not published yet; publish its report first"
                if verification_only
                else f"{runs_dir / name}: no report.json; run `attn sweep experiments/{name}.yaml` first"
            )
        report = read_report(reports[name], name, published=verification_only)
        if not verification_only:
            for source in _sources(runs_dir / name):
                _regular_file(source)
        if verifications[name][".md"].exists() and not verifications[name][".json"].exists():
            raise runs.RunError(
                f"{verifications[name]['.md']}: no {name}.json beside it (an older attn verify "
                f"wrote it); run `attn verify experiments/{name}.yaml` again (finished runs are kept)"
            )
        if verification_only and not verifications[name][".json"].exists():  # its .md is written afresh from it
            raise runs.RunError(
                f"{verifications[name]['.json']}: no verification of {name} there; run `attn verify "
                f"experiments/{name}.yaml` with its published report as run first"
            )
        if verifications[name][".json"].exists():
            verification = read_verification(verifications[name][".json"], name)
            _check_verified(verifications[name][".json"], verification, reports[name])
            if verification_only:
                _check_replaces_nothing(verifications[name][".json"], verification, RESULTS / name / "verify.json")
            unclean = unclean_reruns(verification)
            if unclean and not allow_mixed:
                raise MixedCode(
                    f"{verifications[name]['.json']}: its re-runs ran uncommitted or unrecorded code "
                    f"({unclean}); verify with committed code (commit or stash the change, then `attn verify "
                    f"experiments/{name}.yaml` again)"
                )
        note = report.get("code_state_note")
        if note and not allow_mixed and not verification_only:
            raise MixedCode(
                f"{runs_dir / name}: {shortened(note[0].lower() + note[1:].rstrip('.'))}; publish runs of one "
                "clean commit (re-run them)"
            )
    bench = None if verification_only else _newest_bench(runs_dir, allow_mixed)
    _check_published(RESULTS, replaced=() if verification_only else names, bench_replaced=bench is not None)
    return _publish_staged(
        {name: verifications[name][".json"] for name in names}, runs_dir, bench, copy_reports=not verification_only
    )


def _publish_staged(
    verifications: dict[str, Path], runs_dir: Path, bench: Path | None, copy_reports: bool
) -> list[Path]:
    """Stage the results with, for each experiment named in `verifications` (name -> its
    verification's JSON, there or not), its report (if copy_reports) and its verification, and
    the benchmark `bench` (runs/bench/bench-<time>.json, or None); swap them in, write the text;
    the paths written. Every source has been checked; a failure before the swap removes the staging."""
    names = list(verifications)
    before = {
        name: read_verification(RESULTS / name / "verify.json", name)
        for name in names
        if (RESULTS / name / "verify.json").exists()
    }  # read before a new report's copy replaces them
    staged = RESULTS.with_name(".results.new")
    _stage(RESULTS, staged)
    written = []
    try:
        for name in names:
            target = staged / name
            if copy_reports:
                kept = not verifications[name].exists() and _verifies(RESULTS / name, runs_dir / name)
                new_report = runs_dir / name / runs.REPORT_FILE
                earlier = _earlier_runs(RESULTS / name, read_report(new_report, name, False), new_report)
                if target.exists():
                    shutil.rmtree(target)
                target.mkdir(parents=True)
                for path in _sources(runs_dir / name):
                    _copy(path, target / path.name)
                if earlier:
                    runs.write_json(target / HISTORY_FILE, earlier)
                for file in ("verify.json", "verify.md") if kept else ():
                    _link_or_copy(RESULTS / name / file, target / file)
            if verifications[name].exists():
                _write_verification(verifications[name], target, before.get(name))
            written.append(RESULTS / name)
        if bench is not None:
            for suffix in (".json", ".md"):
                _copy(bench.with_suffix(suffix), staged / f"bench{suffix}")
                written.append(RESULTS / f"bench{suffix}")
        experiments_text, text = _texts(_reports(staged), staged, read_bench(staged / "bench.json"))
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    _swap_in(staged, RESULTS)  # the one step from the old results to the new
    return written + _write_texts(experiments_text, text)


def _earlier_runs(published: Path, report: dict, report_path: Path) -> list[dict]:
    """The runs published in `published` before `report` (read from report_path), oldest first, where they were of
    the same seeds and claims (the same claims digest) and are not its own runs: each as its report said it was
    made and judged (_made), one entry a run (its frozen_at), so that a re-made report reads as a re-run of
    those seeds, never as a new test of its claims. Empty where nothing was published or it was of another
    design; the history there as it was where the report published there cannot be read (it is being replaced)."""
    digest, frozen = (report.get("claims") or {}).get("digest"), _made(report)["frozen_at"]
    history = read_history(published / HISTORY_FILE, published.name) if (published / HISTORY_FILE).exists() else []
    if not digest or not (published / runs.REPORT_FILE).exists():
        return []
    try:
        old = read_report(published / runs.REPORT_FILE, published.name, published=True)
    except runs.RunError:
        return history
    if (old.get("claims") or {}).get("digest") != digest:
        return []
    made = _made(old)
    same_runs = (frozen is not None and made["frozen_at"] == frozen) or (
        (published / runs.REPORT_FILE).read_bytes() == report_path.read_bytes()
    )
    if not same_runs and (kept := _paths_kept(published, report_path.parent)) is not None:
        made["paths_kept"] = kept
    # one entry a run: by when its claims were frozen, or, where a report did not say, by all it said
    entries = {e["frozen_at"] or json.dumps(e, sort_keys=True): e for e in [*history, *([] if same_runs else [made])]}
    entries.pop(frozen, None)  # never its own runs
    return sorted(entries.values(), key=lambda e: e["frozen_at"] or "")  # oldest first; an unrecorded time first


def _paths_kept(published: Path, run_dir: Path) -> dict | None:
    """Of the runs that ended finite in both the report published in `published` and the one in run_dir (the same
    seeds), how many took the same path bit for bit (verify.unchanged_runs): on one platform and training code,
    all; None where either keeps no per-seed records."""
    try:
        then, now = runs.read_report_json(published), runs.read_report_json(run_dir)
    except runs.RunError:
        return None
    if not all("seeds" in cell for report in (then, now) for cell in report.get("cells") or [{}]):
        return None
    return verify.unchanged_runs({"then": then, "now": now})["now"]


def _made(report: dict) -> dict:
    """When a report's claims were frozen (its sweep's start), the code and machine its runs ran on, its verdicts."""
    platform = report["platform"]
    return {
        "frozen_at": (report.get("claims") or {}).get("frozen_at"),
        **{key: platform.get(key, []) for key in ("attn_commit", "cpu", "blas")},
        "verdicts": {e["id"]: e["verdict"] for e in report["expectations"]},
    }


def _sources(run_dir: Path) -> list[Path]:
    """The files of an experiment's directory that publish copies (COPIED), in order."""
    return [path for pattern in COPIED for path in sorted(run_dir.glob(pattern))]


def _verifies(published: Path, run_dir: Path) -> bool:
    """Whether the verification published in `published` verified the report in run_dir too: the same
    report, byte for byte, or one of the digest it records (a re-publish of one report keeps it)."""
    verification = published / "verify.json"
    if not verification.exists() or not (published / "verify.md").exists():
        return False
    new = run_dir / runs.REPORT_FILE
    if (published / runs.REPORT_FILE).read_bytes() == new.read_bytes():
        return True
    as_run = read_verification(verification, published.name).get("as_run") or {}
    return as_run.get("sha256") == verify.report_digest(new)


def _newest_bench(runs_dir: Path, allow_mixed: bool) -> Path | None:
    """The newest runs/bench/bench-<time>.json (None if none); refused (RunError, one line) where publish
    cannot make its text from it, or where it did not time one clean commit, unless allow_mixed."""
    benches = sorted((runs_dir / "bench").glob("bench-*.json"))  # named by time
    if not benches:
        return None
    newest = benches[-1]
    bench = read_bench(newest)
    bench_block(bench, newest)  # one publish can make its text from, before anything is staged
    commit = bench.get("attn_commit")
    if not allow_mixed and (not isinstance(commit, str) or not commit or commit.endswith("-dirty")):
        said = (
            f"timed uncommitted code ({shown(commit)})"
            if isinstance(commit, str) and commit
            else f"does not say which commit it timed (attn_commit: {shown(repr(commit))})"
        )
        raise MixedCode(
            f"{newest}: {said}; publish a benchmark of one clean commit (run `attn bench` "
            "from it, or move this one out of the way)"
        )
    for path in (newest, newest.with_suffix(".md")):
        _regular_file(path)
    return newest


def _write_verification(verification: Path, target: Path, before: dict | None) -> None:
    """A verification of the report published in `target`, as verify.json and .md there, together with
    the re-runs of the one published there `before` that it did not make, if that one verified the same
    report (attn.experiment.verification.merge): a large experiment is so verified a re-run at a time."""
    result = read_verification(verification, target.name)
    if before is not None and (before.get("as_run") or {}).get("sha256") == result["as_run"]["sha256"]:
        result = merge(before, result)
    runs.write_json(target / "verify.json", result)
    runs.write_atomic(target / "verify.md", verify_markdown(markdown_safe(result)).encode())


def _check_replaces_nothing(verification: Path, after: dict, published: Path) -> None:
    """RunError where a verification published alone (`after`, read from `verification`) would replace one it
    cannot be merged with (of another report, or one that does not say which) that made re-runs it did not."""
    if not published.exists():
        return
    before = read_verification(published, published.parent.name)
    lost = set(before["platforms"]) - set(after["platforms"])
    if (before.get("as_run") or {}).get("sha256") != (after.get("as_run") or {}).get("sha256") and lost:
        raise runs.RunError(
            f"{published}: made the {', '.join(reruns_in_order(lost))} re-runs that {verification} "
            "did not, and cannot be merged with it (it does not say it verified the same report); "
            "verify with every re-run it made (finished re-runs are kept)"
        )


def _check_verified(path: Path, verification: dict, report: Path) -> None:
    """RunError unless the verification (read from `path`) took this report as run (verify.report_digest);
    one written before verify recorded which cannot say, and is refused too."""
    as_run = verification.get("as_run") or {}
    if as_run.get("sha256") != verify.report_digest(report):
        said = (
            f"verified {shown(str(as_run.get('report')))}, not {report}"
            if as_run
            else f"does not say which report it verified (an older attn verify wrote it), so not {report}"
        )
        raise runs.RunError(f"{path}: {said}; verify {report} itself (finished re-runs are kept)")


def publish_text() -> list[Path]:
    """experiments/README.md and README.md's generated blocks written afresh from the results already
    published (experiments/results/), copying nothing: after a change to how the text is generated, or
    to an experiment file's design, which the text compares its results with. The paths written."""
    with _publishing():
        _recover(RESULTS)
        _check_results_tree(RESULTS)
        _check_published(RESULTS, replaced=())
        reports = _reports(RESULTS)
        if not reports:
            raise runs.RunError(f"{RESULTS}: no published report to write the text from")
        return _write_texts(*_texts(reports, RESULTS, read_bench(RESULTS / "bench.json")))


def _reports(results: Path) -> dict[str, dict]:
    return {p.parent.name: read_report(p, p.parent.name, published=True) for p in sorted(results.glob("*/report.json"))}


def read_verifications(results: Path) -> dict[str, dict]:
    """Each verification published in `results` (results/<name>/verify.json), read (read_verification), by name."""
    return {p.parent.name: read_verification(p, p.parent.name) for p in sorted(results.glob("*/verify.json"))}


def _texts(reports: dict[str, dict], results: Path, bench: dict | None) -> tuple[str, str]:
    """(experiments/README.md, README.md) as generated (attn.results_text) from these reports, the verifications
    and figures in `results` and the bench, against the experiment files in REPO."""
    for name in reports:
        if not _is_id(name):  # a published result's name is its experiment file's, and goes into paths and links
            raise runs.RunError(
                f"{results / shown(name)}: not an experiment's name (letters, digits, '_', '.' or '-'); move it out "
                "of experiments/results"
            )
    verifications, histories = read_verifications(results), read_histories(results)
    text = (REPO / "README.md").read_text()
    if HEADLINE in reports:
        text = with_block(
            text, RESULTS_BEGIN, RESULTS_END, results_block(reports, verifications, REPO, histories=histories)
        )
    if bench is not None:
        text = with_block(text, BENCH_BEGIN, BENCH_END, bench_block(bench, results / "bench.json"))
    return experiments_readme(reports, verifications, results, REPO, histories=histories), text


def _write_texts(experiments_text: str, readme_text: str) -> list[Path]:
    """Each written atomically, README.md only if it changed; the paths written."""
    readme = REPO / "README.md"
    runs.write_atomic(REPO / "experiments" / "README.md", experiments_text.encode())
    written = [REPO / "experiments" / "README.md"]
    if readme_text != readme.read_text():
        runs.write_atomic(readme, readme_text.encode())
        written.append(readme)
    return written


def _recover(results: Path) -> None:
    """Undo what a killed publish left: the old results put back if a
    two-rename swap stopped between its renames; its staging removed
    (a symbolic link there is removed, never followed)."""
    old = results.with_name(".results.old")
    if old.is_dir() and not old.is_symlink() and not os.path.lexists(results):
        os.rename(old, results)
    for leftover in (old, results.with_name(".results.new")):
        if leftover.is_symlink() or leftover.is_file():
            leftover.unlink()
        elif leftover.exists():
            shutil.rmtree(leftover)


def _stage(results: Path, staged: Path) -> None:
    """staged: a copy of results made of hard links (no bytes copied; _check_results_tree has refused links
    and special files, and none is followed here)."""
    staged.mkdir(parents=True)
    if not results.exists():
        return
    for path in sorted(results.rglob("*")):
        target = staged / path.relative_to(results)
        if path.is_dir() and not path.is_symlink():
            target.mkdir()
        else:
            _link_or_copy(path, target)


def _link_or_copy(source: Path, target: Path) -> None:
    """target a hard link of source (a symbolic link itself, never what it points to), or a copy of its bytes
    where the file system cannot link."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        runs.write_atomic(target, _regular_file(source))


def _copy(source: Path, target: Path) -> None:
    """source's bytes into target, durably (fsync, rename); a hard link
    staged there is replaced, never written through; a symbolic link is refused, never followed."""
    runs.write_atomic(target, _regular_file(source))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _swap_in(staged: Path, results: Path) -> None:
    """Put staged where results is in one atomic step (the old results go
    to staged's name and are removed)."""
    if results.exists() and _exchange(staged, results):
        shutil.rmtree(staged)
    else:
        old = results.with_name(".results.old")
        if results.exists():
            os.rename(results, old)
        os.rename(staged, results)
        if old.exists():
            shutil.rmtree(old)
    with contextlib.suppress(OSError):  # the swap made durable; some file systems cannot fsync a directory
        fd = os.open(results.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    runs.durable_write_done()


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise runs.RunError(
        f"{b}: cannot swap in the new results: {os.strerror(err)} (the old results are left as they were)"
    )


# ---------------------------------------------------------------------------
# One publish at a time; what it reads, checked; nothing followed through a link
# ---------------------------------------------------------------------------
def _publishing() -> locks.RunLock:
    """One publish at a time: experiments/'s RunLock (experiments/.lock), held from the first check to the last
    write. A second publish is refused at once (RunLocked, one line naming the first): one publish's recovery
    would otherwise remove the other's staging before its swap."""
    return locks.RunLock(RESULTS.parent, "publish")


def _check_results_tree(results: Path) -> None:
    """RunError, one line naming the path, where experiments/results is a symbolic link or not a directory, or
    holds a symbolic link or anything but directories and regular files: publish links every published file
    into its staging, and would link or remove what lies outside."""
    if results.is_symlink():
        raise runs.RunError(
            f"{results}: is a symbolic link; attn publishes only into a real directory (move the directory it "
            "points to here, or remove the link)"
        )
    if not results.exists():
        return
    if not results.is_dir():
        raise runs.RunError(f"{results}: not a directory; move it out of the way")
    for directory, subdirectories, files in os.walk(results):
        for name in sorted(subdirectories + files):
            path = Path(directory) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise runs.RunError(
                    f"{path}: a symbolic link in the published results; publish keeps only files it wrote "
                    "(remove the link)"
                )
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise runs.RunError(f"{path}: not a regular file or directory; remove it")


def _check_published(results: Path, replaced, bench_replaced: bool = False) -> None:
    """Every report.json and verify.json published, but those of the experiments `replaced`, every history.json,
    and the benchmark unless bench_replaced, read and checked (read_report, read_verification, read_histories,
    bench_block): the text is made from them all, after the staging."""
    for path in sorted(results.glob("*/report.json")):
        if path.parent.name not in replaced:
            read_report(path, path.parent.name, published=True)
    for path in sorted(results.glob("*/verify.json")):
        if path.parent.name not in replaced:
            read_verification(path, path.parent.name)
    read_histories(results)  # a replaced report's too: publish carries it forward (_earlier_runs)
    if (results / "bench.json").exists() and not bench_replaced:
        bench_block(read_bench(results / "bench.json"), results / "bench.json")


def _regular_file(path: Path) -> bytes:
    """The bytes of `path`, a regular file: RunError, one line, for a symbolic link (never followed) or
    anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise runs.RunError(
                f"{path}: a symbolic link; publish copies only the files themselves (put the file there "
                "in place of the link)"
            ) from None
        raise
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise runs.RunError(f"{path}: not a regular file; publish copies only files")
        return file.read()


def _read_json(path: Path, remedy: str):
    """The JSON in `path`; RunError, one line naming the file, what is wrong and `remedy`, for one that is not
    UTF-8 JSON."""
    data = _regular_file(path)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise runs.RunError(f"{path}: not UTF-8 text (byte {err.start}); {remedy}") from None
    except json.JSONDecodeError as err:
        raise runs.RunError(
            f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); {remedy}"
        ) from None
    except RecursionError:
        raise runs.RunError(f"{path}: not valid JSON (nested too deeply); {remedy}") from None


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true or false", type(None): "null"}.get(
        type(value), "a number"
    )


def _is_number(value) -> bool:  # a number as report.json writes one (attn.text.json_number): inf as text, NaN null
    return (
        value is None or value in ("inf", "-inf") or (isinstance(value, (int, float)) and not isinstance(value, bool))
    )


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_id(value) -> bool:  # a claim's id, as an experiment file accepts it (attn.experiment.report_spec)
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", value) is not None


# What publish reads of each file, by field, as runs.json_shape_problem's shapes (runs.MayLack: a field a file
# may lack).
NUMBER = runs.Check(_is_number, "a number")
COUNT = runs.Check(_is_count, "a count")
TEXT_OR_NULL = runs.Check(lambda v: v is None or isinstance(v, str), "text or null")
ID = runs.Check(_is_id, "letters, digits, '_', '.' or '-'")
VALUE = runs.Check(lambda v: isinstance(v, (str, int, float)) or v is None, "a value")
VERDICT = runs.Check(lambda v: v in (CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE), "a verdict")
RUN_COUNTS = {"same": COUNT, "runs": COUNT}
EFFECT = {"name": str, "value": NUMBER, "low": NUMBER, "high": NUMBER, "bound": runs.MayLack(TEXT_OR_NULL)}
POINT = {
    "x": [VALUE],
    **{
        key: runs.MayLack(NUMBER)
        for key in ("value", "low", "high", "other_value", "other_low", "other_high", "p", "p_reverse")
    },
    "n": runs.MayLack(COUNT),
    "pairs": runs.MayLack(COUNT),
    "setting": runs.MayLack(VALUE),
    "note": runs.MayLack(str),
    "verdict": runs.MayLack(str),
    "effect": runs.MayLack(EFFECT),
}
EXPECTATION = {
    "id": ID,
    "claim": str,
    "verdict": VERDICT,
    "rule": runs.MayLack(str),
    "test": runs.MayLack(runs.Check(lambda v: v in ("interval", "mcnemar", "sign", "fisher"), "a test")),
    "frozen": runs.MayLack(TEXT_OR_NULL),
    "edited_after_runs": runs.MayLack(TEXT_OR_NULL),
    "p_holm": runs.MayLack(NUMBER),
    "points": runs.MayLack([POINT]),
}
REPORT = {
    "description": str,
    "runs": COUNT,
    "headline": str,
    "platform": runs.EachValue([str]),
    "expectations": [EXPECTATION],
    "code_state_note": runs.MayLack(TEXT_OR_NULL),
    "code_states": runs.MayLack(runs.EachValue(COUNT)),
    "claims": runs.MayLack({"digest": runs.MayLack(TEXT_OR_NULL), "frozen_at": runs.MayLack(TEXT_OR_NULL)}),
    "layout": runs.MayLack({"x": runs.MayLack([str]), "best_of": runs.MayLack(TEXT_OR_NULL)}),
}
EARLIER_RUNS = {
    "frozen_at": TEXT_OR_NULL,
    "attn_commit": [str],
    "cpu": [str],
    "blas": [str],
    "verdicts": runs.EachValue(VERDICT),
    "paths_kept": runs.MayLack(RUN_COUNTS),
}
VERIFICATION = {
    "experiment": str,
    "as_run": runs.MayLack(
        runs.Check(lambda v: v is None or (isinstance(v, dict) and TEXT_OR_NULL.accepts(v.get("sha256"))), "an object")
    ),
    "platforms": runs.EachValue(
        runs.EachValue(runs.Check(lambda v: v is None or isinstance(v, (str, list)), "text or a list"))
    ),
    "expectations": [{"id": ID, "verdicts": runs.EachValue(str), "agree": bool}],
    "agree": bool,
    "materialized": runs.MayLack(TEXT_OR_NULL),
    "cells": runs.MayLack([{"settings": dict, "learned": runs.EachValue(str), "same": bool}]),
    "unchanged": runs.MayLack(runs.EachValue(RUN_COUNTS)),
    "remade": runs.MayLack(RUN_COUNTS),
}


def read_report(path: Path, name: str, published: bool) -> dict:
    """A report.json as publish reads it (REPORT); RunError, one line, for one it cannot be made from."""
    remedy = (
        f"restore it (`git checkout -- experiments/results/{name}`) or publish its report again"
        if published
        else f"write it again with `attn report experiments/{name}.yaml`"
    )
    report = _read_json(path, remedy)
    problem = runs.json_shape_problem(report, REPORT)
    if problem:
        raise runs.RunError(f"{path}: {problem}; {remedy}")
    return report


def read_history(path: Path, name: str) -> list[dict]:
    """A history.json as publish reads it (a list of EARLIER_RUNS); RunError, one line, for one it cannot read."""
    remedy = f"restore it (`git checkout -- experiments/results/{name}`)"
    history = _read_json(path, remedy)
    problem = runs.json_shape_problem(history, [EARLIER_RUNS])
    if problem:
        raise runs.RunError(f"{path}: {problem}; {remedy}")
    return history


def read_histories(results: Path) -> dict[str, list[dict]]:
    """Each history published in `results` (results/<name>/history.json), read (read_history), by name."""
    return {p.parent.name: read_history(p, p.parent.name) for p in sorted(results.glob(f"*/{HISTORY_FILE}"))}


def read_verification(path: Path, name: str) -> dict:
    """A verify.json as publish reads it (VERIFICATION); RunError, one line, for one it cannot be made from."""
    remedy = f"verify again (`attn verify experiments/{name}.yaml`; finished re-runs are kept)"
    verification = _read_json(path, remedy)
    problem = runs.json_shape_problem(verification, VERIFICATION)
    if problem:
        raise runs.RunError(f"{path}: {problem}; {remedy}")
    return verification


def read_bench(path: Path) -> dict | None:
    """A benchmark's JSON (None where there is no file); RunError, one line, for one that is not a JSON
    object (bench_block names what else it lacks)."""
    if not os.path.lexists(path):
        return None
    remedy = "run `attn bench` again, or move it out of the way"
    bench = _read_json(path, remedy)
    if not isinstance(bench, dict):
        raise runs.RunError(f"{path}: got {_kind(bench)}; expected an object; {remedy}")
    return bench


def write_devices_block(result: dict, path: Path = BENCH_DOC) -> Path:
    """docs/bench.md with its devices block replaced, atomically: the devices' table
    (attn.bench.device_gains.table) of `result`, every string of it markdown_safe."""
    text = with_block(
        path.read_text(), DEVICES_BEGIN, DEVICES_END, device_gains.table(markdown_safe(result)), path.name
    )
    runs.write_atomic(path, text.encode())
    return path
