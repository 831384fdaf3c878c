"""attn bench --board: the board measured at scale in child processes, this checkout's and another's side by side
on the same files, and docs/bench.md's board block written from the newest measurement."""

import json
import shutil
from pathlib import Path

import pytest

from attn import cli, publish
from attn.board import bench
from attn.results_text import BOARD_BEGIN, BOARD_END
from attn.train import lifecycle

REPO = Path(__file__).resolve().parents[1]


def a_board(cold: float, records_sent: int) -> dict:
    """One board's figures, as a measuring child writes them."""
    return {
        "board": {"cold_s": cold, "runs": 12, "bytes": 2e6, "warm_304_s": 0.05, "warm_status": 304, "warm_200_s": 0.06},
        "records": {
            "first_board_s": 1.5,
            "records_s": 0.5,
            "records_sent": records_sent,
            "bytes": 7e5,
            "again_s": 0.0,
            "peak_rss_mib": 80.0,
            "peak_over_start_mib": 20.0,
        },
    }


def a_result(*boards) -> dict:
    return {
        "date": "2026-12-06 19:00 UTC",
        "machine": "a CPU",
        "n_runs": 12,
        "megabytes": 1.0,
        "big_file_bytes": 1e6,
        "boards": list(boards),
    }


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_table_sets_each_board_beside_this_one_and_divides():
    old, new = {"code": "/old", "label": "0128d8f", **a_board(4.0, 9000)}, {"code": "/new", "label": "abc1234"}
    lines = bench.markdown(a_result(old, {**new, **a_board(1.0, 3000)})).splitlines()
    assert cells(lines[2]) == ["measurement", "0128d8f", "abc1234", "abc1234 / 0128d8f"]
    cold = cells(lines[4])
    assert "12 runs" in cold[0] and cold[3] == "0.25"
    assert cells(next(line for line in lines if line.startswith("| the same again")))[3] == "—", "0 is no divisor"
    assert "9,000 records" in "\n".join(lines)
    slower = cells(bench.markdown(a_result(old, {**new, **a_board(500.0, 3000)})).splitlines()[4])
    assert slower[3] == "125", "no e-notation"


def test_boards_of_one_label_are_told_apart_by_their_code():
    one = {"label": "abc1234", **a_board(1.0, 10)}
    header = cells(bench.markdown(a_result({**one, "code": "/a"}, {**one, "code": "/b"})).splitlines()[2])
    assert header == ["measurement", "abc1234 (/a)", "abc1234 (/b)", "abc1234 (/b) / abc1234 (/a)"]


@pytest.mark.slow
def test_a_board_bench_measures_another_checkout_beside_this_one(tmp_path, capsys, monkeypatch):
    """A small measurement through the CLI, the other checkout a copy of attn given by a relative path (the
    children run elsewhere): each child imports its own, this checkout is the last column, and a measurement
    at other sizes than the table's leaves docs/bench.md alone."""
    shutil.copytree(REPO / "attn", tmp_path / "other" / "attn", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    doc = tmp_path / "bench.md"
    doc.write_text(f"# speed\n\n{BOARD_BEGIN}\nstale\n{BOARD_END}\n")
    monkeypatch.setattr(publish, "BENCH_DOC", doc)
    args = ["bench", "--board", "--board-runs", "3", "--board-megabytes", "0.05", "--board-code", "other"]
    assert cli.main([*args, "--out", str(tmp_path / "out")]) == 0
    (written,) = (tmp_path / "out").glob("board-*.json")
    boards = json.loads(written.read_text())["boards"]
    assert [b["code"] for b in boards] == [str(tmp_path / "other"), str(REPO)]
    assert [b["label"] for b in boards] == ["other", bench.code_label(REPO)]
    assert Path(boards[0]["board"]["attn"]).is_relative_to(tmp_path / "other")
    assert Path(boards[1]["records"]["attn"]).is_relative_to(REPO)
    for board in boards:
        assert board["board"]["runs"] == 3 and board["board"]["warm_status"] == 304
        assert board["records"]["status"] == 200 and board["records"]["records_sent"] > 0
    assert "stale" in doc.read_text()
    assert "docs/bench.md: not written" in capsys.readouterr().out


def test_the_board_block_is_the_table_of_the_measurement(tmp_path):
    doc = tmp_path / "bench.md"
    doc.write_text(f"# speed\n\n{BOARD_BEGIN}\nstale\n{BOARD_END}\n\nafter\n")
    result = a_result({"code": "/new", "label": "abc1234", **a_board(1.0, 3000)})
    assert bench.doc_problem(doc) is None
    bench.write_board_block(result, doc)
    text = doc.read_text()
    assert "stale" not in text and text.endswith("\nafter\n") and bench.markdown(result).strip() in text
    doc.write_text("# speed, no block\n")
    assert "no generated block" in bench.doc_problem(doc) and str(doc) in bench.doc_problem(doc)


def test_a_broken_board_block_is_refused_before_anything_is_measured(tmp_path, capsys, monkeypatch):
    doc = tmp_path / "bench.md"
    doc.write_text(f"{BOARD_END}\n{BOARD_BEGIN}\n")
    monkeypatch.setattr(publish, "BENCH_DOC", doc)
    monkeypatch.setattr(bench, "measure_board", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured")))
    assert cli.main(["bench", "--board", "--out", str(tmp_path / "out")]) == 2
    assert str(doc) in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_checkout_without_its_own_git_is_named_by_its_directory(tmp_path):
    """A git archive has no .git: inside another repository it must not take that repository's commit."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    archive = tmp_path / "attn-0128d8f"
    (archive / "attn").mkdir(parents=True)
    (archive / "attn" / "__init__.py").write_text("")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    assert lifecycle.source_revision(archive / "attn") is not None, "git would name the enclosing repository"
    assert bench.code_label(archive) == "attn-0128d8f"
    if (REPO / ".git").exists():  # a clone or worktree: its commit
        assert bench.code_label(REPO) == lifecycle.source_revision(REPO / "attn")
