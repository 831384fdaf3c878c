"""`attn bench --board`: what the board costs at scale, measured in child processes.

    many runs   N synthetic run directories (a real config, LOG records, a summary; no training):
                GET /api/board cold (the first look), then warm: a poll whose If-None-Match holds
                the last ETag (nothing changed: a 304) and one without it (a 200 from what is held)
    big file    one run whose metrics.jsonl is MB megabytes: GET /api/records?since=0, its time,
                the bytes sent, and the child's peak memory (ru_maxrss) over that of a child that
                only imported the board

Each measurement runs in a fresh `python -c` child whose sys.path starts with `code` (default: this
checkout), so the same figures can be taken of an older commit's board (e.g. a `git archive` of it):
the child uses only what every version has, attn.board.data.Board and attn.board.server.open_server.
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

LOG_EVERY = 10

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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(root)], env=env, capture_output=True, text=True, check=False, cwd=root
    )  # not the caller's directory: `python -c` puts it first on sys.path
    if done.returncode:
        raise RuntimeError(f"board bench child ({mode}) failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_board(
    n_runs: int = 1200, megabytes: float = 200, code: Path | None = None, progress=lambda message: None
) -> dict:
    """Every board figure as one JSON-ready dict; code: the checkout whose board is measured."""
    code = Path(code or Path(__file__).resolve().parents[2])
    result = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "code": str(code), "n_runs": n_runs, "megabytes": megabytes}
    with tempfile.TemporaryDirectory(prefix="attn-board-bench-") as tmp:
        progress(f"board: writing {n_runs} runs")
        write_many_runs(Path(tmp) / "many", n_runs)
        progress("board: GET /api/board, cold and warm")
        result["board"] = _child("board", Path(tmp) / "many", code)
        progress(f"board: writing a {megabytes:g} MB metrics.jsonl")
        write_big_run(Path(tmp) / "big", megabytes)
        result["big_file_bytes"] = (Path(tmp) / "big" / "big" / "metrics.jsonl").stat().st_size
        progress("board: GET /api/records of it")
        result["records"] = _child("records", Path(tmp) / "big", code)
    return result


def markdown(result: dict) -> str:
    b, r = result["board"], result["records"]
    return "\n".join(
        [
            f"### attn board benchmark: {result['date']} (attn from {os.path.dirname(b.get('attn', result['code']))})",
            "",
            markdown_table(
                ["measurement", "figure"],
                [
                    [f"GET /api/board, cold, {b['runs']} runs", f"{b['cold_s']:.3f} s ({b['bytes'] / 1e6:.1f} MB)"],
                    [
                        "GET /api/board, warm poll with If-None-Match (nothing new)",
                        f"{b['warm_304_s'] * 1e3:.1f} ms (status {b['warm_status']})",
                    ],
                    ["GET /api/board, warm, without If-None-Match", f"{b['warm_200_s'] * 1e3:.1f} ms"],
                    [
                        f"GET /api/board, first look at a run with a {result['big_file_bytes'] / 1e6:.0f} MB "
                        "metrics.jsonl",
                        f"{r['first_board_s']:.2f} s",
                    ],
                    [
                        "then GET /api/records?since=0 of it",
                        f"{r['records_s']:.2f} s, {r['records_sent']} records ({r['bytes'] / 1e6:.2f} MB) sent",
                    ],
                    ["the same again (file unchanged)", f"{r['again_s']:.3f} s"],
                    [
                        "peak memory of that server process (ru_maxrss; growth over its imports)",
                        f"{r['peak_rss_mib']:.0f} MiB (+{r['peak_over_start_mib']:.0f} MiB)",
                    ],
                ],
            ),
            "",
        ]
    )
