"""Run directories written by hand for the board's tests: a real config
(attn.config.schema.to_dict of a Config, runs.write_config), made-up records
(runs.append_metrics) and a summary (runs.write_json), with no training."""

import contextlib
import math
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np

from attn.board import data, server
from attn.config.loading import load_config
from attn.config.schema import to_dict
from attn.store import locks, runs

LOG_EVERY = 10


def record(step: int, scale: str, seed: int, wall_per_step: float = 0.01) -> dict:
    """A made-up record: the scaled runs' loss falls faster; each seed's noise is its own."""
    rng = np.random.default_rng([seed, step])
    tau = 40.0 if scale == "sqrt" else 160.0
    eval_loss = 2.5 * math.exp(-step / tau) * (1 + 0.1 * rng.random()) + 1e-3
    return {
        "step": step,
        "eval_loss": eval_loss,
        "train_loss": eval_loss * 1.1,
        "eval_accuracy": min(1.0, 1.05 - eval_loss / 2.5),
        "score_std": 1.0 + step / (tau * 10),
        "attn_entropy": eval_loss,
        "saturated_frac": 0.0,
        "grad_norm/W_q": eval_loss,
        "grad_norm/W_k": eval_loss,
        "wall_time": step * wall_per_step * (1 + 0.2 * seed),
    }


def write_run(
    directory: Path, *overrides: str, status: str = "completed", steps: int = 200, logged_until: int | None = None
) -> Path:
    """A run directory with records every LOG_EVERY steps up to logged_until (default: steps).
    status running: this process is its writer (effective status running); stale: a writer
    on another host whose heartbeat stopped long ago."""
    config = load_config(None, [f"train.steps={steps}", *overrides])
    directory.mkdir(parents=True)
    runs.write_config(directory, to_dict(config), {"overrides": list(overrides)})
    for step in range(0, (steps if logged_until is None else logged_until) + 1, LOG_EVERY):
        runs.append_metrics(directory, record(step, config.model.scale, config.seed))
    write_summary(directory, status)
    return directory


def write_summary(directory: Path, status: str) -> None:
    stale = {"updated_at": time.time() - 2 * locks.STALE_AFTER_SECONDS, "pid": 1, "host": "not-" + socket.gethostname()}
    writer = {"running": runs.heartbeat_fields(), "stale": stale}.get(
        status, {"updated_at": time.time(), "pid": os.getpid(), "host": socket.gethostname()}
    )
    runs.write_json(directory / "summary.json", {"status": "running" if status == "stale" else status, **writer})


@contextlib.contextmanager
def serving(board: data.Board, timeout: float = server.TIMEOUT_SECONDS, port: int = 0):
    """The board served on `port` (0: a free one), in a thread, while the block runs."""
    httpd = server.BoardServer(board, "127.0.0.1", port, timeout=timeout)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
