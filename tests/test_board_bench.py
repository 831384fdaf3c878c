"""attn bench --board: the board measured at scale in child processes, this checkout's and another's side by side
on the same files, and docs/bench.md's board block written from the newest measurement."""

import json
from pathlib import Path

from attn import cli
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


def test_the_table_sets_each_board_beside_this_one_and_divides():
    result = {
        "date": "2026-12-06 19:00 UTC",
        "machine": "a CPU",
        "n_runs": 12,
        "megabytes": 1.0,
        "big_file_bytes": 1e6,
        "boards": [
            {"code": "/old", "label": "0128d8f", **a_board(4.0, 9000)},
            {"code": "/new", "label": "abc1234", **a_board(1.0, 3000)},
        ],
    }
    lines = bench.markdown(result).splitlines()
    header = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert header == ["measurement", "0128d8f", "abc1234", "abc1234 / 0128d8f"]
    cold = [cell.strip() for cell in lines[4].strip("|").split("|")]
    assert cold[0] == "GET /api/board, cold, 12 runs" and cold[3] == "0.25"
    again = next(line for line in lines if line.startswith("| the same again"))
    assert again.rstrip(" |").endswith("—"), "a figure of 0 is no divisor"
    assert "9,000 records" in bench.markdown(result)


def test_a_measurement_made_before_boards_were_listed_reads_as_one_board():
    old = {"date": "2026-12-01 10:00 UTC", "code": "/work/main", "n_runs": 12, "megabytes": 1.0, "big_file_bytes": 1e6}
    header = bench.markdown({**old, **a_board(2.0, 10)}).splitlines()[2]
    assert [cell.strip() for cell in header.strip("|").split("|")] == ["measurement", "main"]


def test_a_board_bench_measures_both_checkouts_and_writes_the_docs_block(tmp_path, capsys):
    """A small measurement through the CLI, with this checkout given as the other one too: both boards read
    the same runs, and the block in a copy of docs/bench.md is the table of the JSON it wrote."""
    doc = tmp_path / "bench.md"
    doc.write_text(f"# speed\n\n{BOARD_BEGIN}\nstale\n{BOARD_END}\n\nafter\n")
    bench_doc = bench.publish.BENCH_DOC
    try:
        bench.publish.BENCH_DOC = doc
        args = ["bench", "--board", "--board-runs", "3", "--board-megabytes", "0.05", "--board-code", str(REPO)]
        assert cli.main([*args, "--out", str(tmp_path / "out")]) == 0
    finally:
        bench.publish.BENCH_DOC = bench_doc
    (written,) = (tmp_path / "out").glob("board-*.json")
    result = json.loads(written.read_text())
    assert [b["code"] for b in result["boards"]] == [str(REPO), str(REPO)]
    label = lifecycle.source_revision(REPO / "attn") if (REPO / ".git").exists() else REPO.name
    assert [b["label"] for b in result["boards"]] == [label, label]
    for board in result["boards"]:
        assert board["board"]["runs"] == 3 and board["board"]["warm_status"] == 304
        assert board["records"]["status"] == 200 and board["records"]["records_sent"] > 0
    text = doc.read_text()
    assert "stale" not in text and text.endswith("\nafter\n")
    assert bench.markdown(result).strip() in text
    assert str(doc) in capsys.readouterr().out


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
    assert bench.code_label(REPO) == (lifecycle.source_revision(REPO / "attn") or REPO.name)
