"""`attn bench --board`: what the board costs at scale, measured in child processes.

    many runs   N synthetic run directories (a real config, LOG records, a summary; no training):
                GET /api/board cold (the first look), then warm: a poll whose If-None-Match holds
                the last ETag (nothing changed: a 304) and one without it (a 200 from what is held)
    big file    one run whose metrics.jsonl is MB megabytes: GET /api/records?since=0, its time,
                the bytes sent, and the child's peak memory (ru_maxrss) over that of a child that
                only imported the board

Each measurement runs in a fresh `python -c` child whose sys.path starts with the checkout measured,
so the same figures are taken, on the same files and in the same run, of this checkout's board and of
each other one given (an older commit's worktree or `git archive`), the others first: the child uses only
what every version has, attn.board.data.Board and attn.board.server.open_server. docs/bench.md's board
block is the table of the newest measurement (write_board_block).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attn.config.loading import load_config
from attn.config.schema import to_dict
from attn.store import runs
from attn.text import markdown_table
from attn.train import lifecycle

LOG_EVERY = 10
TABLE_RUNS, TABLE_MEGABYTES = 1200, 200.0  # the sizes docs/bench.md's board table is measured at (the defaults)

_CHILD = r"""
import json, resource, sys, threading, time, http.client
from attn.board.data import Board
from attn.board.server import open_server
mode, root = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
server, _ = open_server(Board([root]), "127.0.0.1", 0)
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]
def get(path, etag=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t = time.perf_counter()
    c.request("GET", path, headers={"If-None-Match": etag} if etag else {})
    r = c.getresponse(); body = r.read(); c.close()
    return time.perf_counter() - t, r.status, r.getheader("ETag"), body
out = {}
if mode == "board":
    out["cold_s"], status, etag, body = get("/api/board")
    out["runs"] = len(json.loads(body)["runs"]); out["bytes"] = len(body)
    polls = [get("/api/board", etag) for _ in range(5)]
    out["warm_304_s"] = sorted(p[0] for p in polls)[2]; out["warm_status"] = polls[0][1]
    out["warm_200_s"] = sorted(get("/api/board")[0] for _ in range(3))[1]
else:
    out["first_board_s"], _, _, body = get("/api/board")  # the first look reads every run's files
    run = json.loads(body)["runs"][0]["id"]
    out["records_s"], status, _, body = get("/api/records?run=" + run + "&since=0")
    out["status"] = status; out["bytes"] = len(body)
    out["records_sent"] = len(json.loads(body).get("records", []))
    out["again_s"] = get("/api/records?run=" + run + "&since=0")[0]
import attn
out["attn"] = attn.__file__
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out["peak_over_start_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
print(json.dumps(out))
"""


def _record(step: int, seed: int) -> dict:
    loss = 2.5 * math.exp(-step / (40.0 + 7 * (seed % 5))) + 1e-3
    return {
        "step": step,
        "train_loss": loss * 1.1,
        "eval_loss": loss,
        "eval_accuracy": min(1.0, 1.05 - loss / 2.5),
        "score_std": 1.0 + step / 400,
        "attn_entropy": loss,
        "saturated_frac": 0.0,
        "grad_norm/W_q": loss,
        "grad_norm/W_k": loss,
        "wall_time": step * 0.01,
    }


def _summary(directory: Path) -> None:
    runs.write_json(
        directory / "summary.json", {"status": "completed", "updated_at": time.time(), "pid": 1, "host": "bench"}
    )


def write_many_runs(root: Path, n: int, steps: int = 500) -> None:
    """n run directories under root/sweep: lr x scale x seed, records every LOG_EVERY steps."""
    lrs = ["0.01", "0.03", "0.1", "0.3", "1.0", "3.0"]
    for i in range(n):
        lr, scale, seed = lrs[i % len(lrs)], ("sqrt", "none")[(i // len(lrs)) % 2], i // (2 * len(lrs))
        directory = root / "sweep" / f"lr{lr}-{scale}-seed{seed}"
        overrides = [f"optim.lr={lr}", f"model.scale={scale}", f"seed={seed}", f"train.steps={steps}"]
        directory.mkdir(parents=True)
        runs.write_config(directory, to_dict(load_config(None, overrides)), {"overrides": overrides})
        lines = "".join(json.dumps(_record(s, seed)) + "\n" for s in range(0, steps + 1, LOG_EVERY))
        (directory / "metrics.jsonl").write_text(lines)
        _summary(directory)


def write_big_run(root: Path, megabytes: float) -> None:
    """One run whose metrics.jsonl holds about `megabytes` MB of records (streamed out, a step per record)."""
    directory = root / "big"
    directory.mkdir(parents=True)
    runs.write_config(directory, to_dict(load_config(None, ["train.steps=100000000"])), {"overrides": []})
    with open(directory / "metrics.jsonl", "w") as out:
        step, written, limit = 0, 0, megabytes * 1e6
        while written < limit:
            line = json.dumps(_record(step, 0)) + "\n"
            out.write(line)
            written += len(line)
            step += 1
    _summary(directory)


def _child(mode: str, root: Path, code: Path) -> dict:
    """One measurement in a fresh process importing attn from `code` (an absolute path: the child runs in
    `root`); RunError when it fails or imported another attn."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(root)], env=env, capture_output=True, text=True, check=False, cwd=root
    )  # not the caller's directory: `python -c` puts it first on sys.path
    if done.returncode:
        raise runs.RunError(f"board bench of {code} ({mode}) failed: {done.stderr.strip()[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(out["attn"]).resolve().is_relative_to(code):
        raise runs.RunError(f"board bench of {code} ({mode}): the child imported attn from {out['attn']}, not {code}")
    return out


def code_label(code: Path) -> str:
    """A checkout's commit (git describe, '-dirty' for uncommitted code) where it is a git checkout of its own,
    else its directory's name (a `git archive`, which any enclosing repository would misname)."""
    revision = lifecycle.source_revision(Path(code) / "attn") if (Path(code) / ".git").exists() else None
    return revision or Path(code).resolve().name


def measure_board(
    n_runs: int = TABLE_RUNS, megabytes: float = TABLE_MEGABYTES, others: tuple = (), progress=lambda message: None
) -> dict:
    """Every board figure as one JSON-ready dict: `boards` holds, for each of `others` (checkouts) and then
    this checkout, its figures on the same synthetic runs."""
    codes = [*(Path(code).resolve() for code in others), Path(__file__).resolve().parents[2]]
    boards = [{"code": str(code), "label": code_label(code)} for code in codes]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": lifecycle.cpu_model(),
        "n_runs": n_runs,
        "megabytes": megabytes,
        "boards": boards,
    }
    with tempfile.TemporaryDirectory(prefix="attn-board-bench-") as tmp:
        progress(f"board: writing {n_runs} runs")
        write_many_runs(Path(tmp) / "many", n_runs)
        for code, board in zip(codes, boards):
            progress(f"board ({board['label']}): GET /api/board, cold and warm")
            board["board"] = _child("board", Path(tmp) / "many", code)
        progress(f"board: writing a {megabytes:g} MB metrics.jsonl")
        write_big_run(Path(tmp) / "big", megabytes)
        result["big_file_bytes"] = (Path(tmp) / "big" / "big" / "metrics.jsonl").stat().st_size
        for code, board in zip(codes, boards):
            progress(f"board ({board['label']}): GET /api/records of it")
            board["records"] = _child("records", Path(tmp) / "big", code)
    return result


# (what is measured, the figure of one board as text, the number a ratio compares) per row of the table
def _rows(result: dict) -> list[tuple[str, object, object]]:
    def board(key):
        return lambda b: b["board"][key]

    def records(key):
        return lambda b: b["records"][key]

    big = f"{result['big_file_bytes'] / 1e6:.0f} MB"
    return [
        (
            f"GET /api/board, cold, {result['n_runs']:,} runs",
            lambda b: f"{b['board']['cold_s']:.3f} s ({b['board']['bytes'] / 1e6:.1f} MB)",
            board("cold_s"),
        ),
        (
            "GET /api/board, warm poll with If-None-Match (nothing new)",
            lambda b: f"{b['board']['warm_304_s'] * 1e3:.1f} ms (status {b['board']['warm_status']})",
            board("warm_304_s"),
        ),
        (
            "GET /api/board, warm, without If-None-Match",
            lambda b: f"{b['board']['warm_200_s'] * 1e3:.1f} ms",
            board("warm_200_s"),
        ),
        (
            f"GET /api/board, first look at a run with a {big} metrics.jsonl",
            lambda b: f"{b['records']['first_board_s']:.2f} s",
            records("first_board_s"),
        ),
        (
            "then GET /api/records?since=0 of it",
            lambda b: (
                f"{b['records']['records_s']:.2f} s, {b['records']['records_sent']:,} records "
                f"({b['records']['bytes'] / 1e6:.2f} MB) sent"
            ),
            records("records_s"),
        ),
        ("the same again (file unchanged)", lambda b: f"{b['records']['again_s']:.3f} s", records("again_s")),
        (
            "peak memory of that server process (ru_maxrss; growth over its imports)",
            lambda b: f"{b['records']['peak_rss_mib']:.0f} MiB (+{b['records']['peak_over_start_mib']:.0f} MiB)",
            records("peak_rss_mib"),
        ),
    ]


def _ratio(this: float, other: float) -> str:
    """this / other as the table shows it: two significant figures, in e-notation only below 1e-4; — over 0."""
    if not other:
        return "—"
    ratio = this / other
    return f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.2g}" if ratio >= 1e-4 else f"{ratio:.1e}"


def markdown(result: dict) -> str:
    """The measurement as a Markdown table: a column per board and, with more than one, this checkout's
    figure over each other's (below 1: this one is faster or smaller)."""
    boards = result["boards"]
    labels = [b["label"] for b in boards]
    labels = [f"{label} ({b['code']})" if labels.count(label) > 1 else label for label, b in zip(labels, boards)]
    this, others = boards[-1], boards[:-1]
    header = ["measurement", *labels, *(f"{labels[-1]} / {label}" for label in labels[:-1])]
    table = [
        [what, *(shown(b) for b in boards), *(_ratio(number(this), number(b)) for b in others)]
        for what, shown, number in _rows(result)
    ]
    machine = f" on {result['machine']}" if result.get("machine") else ""
    counted = "1 board" if len(boards) == 1 else f"{len(boards)} boards"
    return "\n".join(
        [
            f"Measured {result['date']}{machine} by `attn bench --board` ({counted}, each in a fresh process, "
            "on the same files):",
            "",
            markdown_table(header, table),
            "",
        ]
    )


def doc_problem(path: Path | None = None) -> str | None:
    """Why the board block cannot be written into docs/bench.md (or `path`), or None: missing (an installed
    attn has no docs), or its markers are not one begin line before one end line."""
    from attn import publish  # not at import: the CLI's parser reads this module's sizes
    from attn.results_text import BOARD_BEGIN, BOARD_END, with_block

    path = Path(path or publish.BENCH_DOC)
    if not path.is_file():
        return f"{path}: not there (an installed attn has no docs/)"
    try:
        with_block(path.read_text(), BOARD_BEGIN, BOARD_END, "", str(path))
    except runs.RunError as err:
        return str(err)
    return None


def write_board_block(result: dict, path: Path | None = None) -> Path:
    """docs/bench.md (or `path`) with its board block replaced, atomically, by markdown(result), every string of
    it markdown_safe."""
    from attn import publish
    from attn.results_text import BOARD_BEGIN, BOARD_END, markdown_safe, with_block

    path = Path(path or publish.BENCH_DOC)
    text = with_block(path.read_text(), BOARD_BEGIN, BOARD_END, markdown(markdown_safe(result)), str(path))
    runs.write_atomic(path, text.encode())
    return path
