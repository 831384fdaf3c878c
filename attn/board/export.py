"""The board as files that open from disk (file://),
with no server and no network.

    DIR/index.html          the page, the board's data embedded in it (every run's records too)
    DIR/static/             the page's files as the server serves them (board.js, board.css, uPlot)
    DIR/files/<root>/...    copies of the figures and reports the page shows, and of each run's
                            config.yaml, metrics.jsonl and summary.json (its page's links), at
                            the paths the server serves them under, each streamed (never read
                            whole) and, as the server serves them, of at most MAX_FILE_BYTES: a
                            larger one is not copied, its link left out and listed as skipped

The page is the server's index.html with the data in place of its `null`
placeholder; it then draws from that data and never polls. DIR must be new,
empty, or an earlier export (its index.html says so): an earlier export's
static/ and files/ are replaced, nothing else in DIR is touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import unquote

from attn.board import STATIC_DIR
from attn.board.data import FILES_PREFIX, Board, NotFound, TooLarge, open_file, to_json
from attn.store import runs

DATA_PLACEHOLDER = '<script id="board-data" type="application/json">null</script>'
EXPORT_MARK = '<meta name="generator" content="attn board">'  # in index.html: a page this module may overwrite
EXPORTED = ("static", "files")  # the directories an export writes beside index.html


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise runs.RunError(
            f"{out_dir}: not a directory; expected a new or empty directory, or an earlier board export"
        )
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    page = out_dir / "index.html"
    try:
        earlier = page.is_file() and EXPORT_MARK in page.read_text(errors="replace")
    except OSError:
        earlier = False
    if not earlier:
        raise runs.RunError(
            f"{out_dir}: not empty and not an earlier board export; "
            "expected a new or empty directory, or an earlier export (its index.html)"
        )


def export(board: Board, out_dir: Path) -> Path:
    """Write the board as of now into out_dir (module docstring); returns out_dir/index.html."""
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    snapshot = board.snapshot(with_records=True)
    template = (STATIC_DIR / "index.html").read_text()
    if DATA_PLACEHOLDER not in template or EXPORT_MARK not in template:
        raise AssertionError(f"{STATIC_DIR / 'index.html'}: lacks the data placeholder or the export mark")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in EXPORTED:
            shutil.rmtree(out_dir / name, ignore_errors=True)
        (out_dir / "static").mkdir()
    except OSError as err:
        raise runs.RunError(f"{out_dir}: cannot write: {err.strerror}") from None
    for source in sorted(p for p in STATIC_DIR.iterdir() if p.is_file() and p.name != "index.html"):
        runs.write_atomic(out_dir / "static" / source.name, source.read_bytes())
    shown = [f["url"] for entry in snapshot["runs"] + snapshot["experiments"] for f in entry["figures"]]
    shown += [e["report_url"] for e in snapshot["experiments"] if e["report_url"]]
    # each run's page (config, files), its files copied as its figures are
    snapshot["run_pages"] = {}
    for run in snapshot["runs"]:
        try:
            snapshot["run_pages"][run["id"]] = board.run_page(run["id"])
        except NotFound:
            continue
        shown += [f["url"] for f in snapshot["run_pages"][run["id"]]["files"] if f["url"] not in shown]
    left_out = set()
    for url in shown:
        relative = unquote(url.removeprefix(FILES_PREFIX))
        target = out_dir / FILES_PREFIX / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        path = board.resolve_file(relative)
        try:
            handle, size = open_file(path)
        except TooLarge as err:
            left_out.add(url)
            snapshot["skipped"].append({"path": str(path), "reason": f"{err}: not copied into this page"})
            continue
        with handle:
            runs.copy_atomic(handle, target, size)
    _leave_out(snapshot, left_out)
    data = f'<script id="board-data" type="application/json">{to_json(snapshot)}</script>'
    page = out_dir / "index.html"
    runs.write_atomic(page, template.replace(DATA_PLACEHOLDER, data).encode())
    return page


def _leave_out(snapshot: dict, urls: set) -> None:
    """The links to files not copied taken out of the page's data: figures, reports and run pages' files."""
    for entry in snapshot["runs"] + snapshot["experiments"]:
        entry["figures"] = [f for f in entry["figures"] if f["url"] not in urls]
    for experiment in snapshot["experiments"]:
        if experiment["report_url"] in urls:
            experiment["report_url"] = None
    for page in snapshot["run_pages"].values():
        page["files"] = [f for f in page["files"] if f["url"] not in urls]
