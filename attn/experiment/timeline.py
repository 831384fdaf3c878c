"""A sweep's timeline: what its main process and each worker did, and when, in <experiment>/timeline.jsonl.

A few timestamps per stack and per phase, never per step, so that keeping it costs nothing a sweep
would notice. The main process is its one writer (Timeline): its own phases (start-up: from the
process's start, the experiment read and checked; plan: claims frozen, stacks planned and handed out;
train: the stacks trained, their results collected; report: the report and its figures written),
and one record per stack, which the worker that trained it returns with its outcomes (StackClock):
when the worker took it, when training began (after its runs were claimed and prepared), when it
ended, the worker's CPU seconds in it and in all, and the moments its loop waited on durable writes
(attn.train.loop.WriteLog: checkpoints, summaries, snapshots, metrics' fsyncs). A worker waiting for
work is what lies between its stacks. Each sweep's records carry its id; concurrent sweeps of one
experiment append to the same file, one line per write, and summarise() reads the last sweep that
started. The file is a diagnosis, not a result: it is appended without fsync, a line cut short by a
crash is skipped on reading, and a failure to write it never costs the sweep (Timeline.error).

summarise() is arithmetic on the records: wall time, CPU seconds of every process, cores busy on
average (CPU seconds / wall), and the core-seconds no process spent, by cause (core_idle).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
from pathlib import Path

TIMELINE_FILE = "timeline.jsonl"


def process_start_time() -> float | None:
    """When this process started, by time.time() (Linux: /proc), else None."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """User and system CPU seconds of this process (RUSAGE_SELF, every thread) or of its waited-for children."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class StackClock:
    """A worker's clock over one stack: started when the worker takes it; training()
    when its runs are claimed and training begins; record() once it has ended."""

    def __init__(self):
        self.start, self.cpu_start = time.time(), time.process_time()
        self.trained: float | None = None
        self.cpu_preparing = 0.0

    def training(self) -> None:
        if self.trained is None:
            self.trained, self.cpu_preparing = time.time(), time.process_time() - self.cpu_start

    def record(self, write_log, cells: int, trained_cells: int) -> dict:
        """The stack's record (write_log: the attn.train.loop.WriteLog its loops were given)."""
        end = time.time()
        return {
            "worker": worker_id(),
            "worker_start": process_start_time(),
            "start": self.start,
            "trained": self.trained if self.trained is not None else end,
            "end": end,
            "cpu": time.process_time() - self.cpu_start,
            "cpu_preparing": self.cpu_preparing,
            "cpu_total": cpu_seconds(),
            "writes": write_log.seconds,
            "write_moments": [
                [round(start - self.start, 4), round(seconds, 4)] for start, seconds in write_log.moments
            ],
            "cells": cells,
            "trained_cells": trained_cells,
        }


class Timeline:
    """The main process's writer of <directory>/timeline.jsonl for one sweep
    with `workers` worker slots. Opening it records the start-up phase (from
    the process's start); phase(name) records a phase; stack(record) a stack;
    close() the end, with this process's CPU seconds and its children's since
    opening. `error`: why the file could not be written, if it could not."""

    def __init__(self, directory: Path, workers: int, runs: int):
        self.path, self.error = Path(directory) / TIMELINE_FILE, None
        opened, started = time.time(), process_start_time()
        self.id = f"{worker_id()}:{opened:.3f}"
        self.children_at_open = cpu_seconds(resource.RUSAGE_CHILDREN)
        self._write(
            {
                "event": "sweep",
                "start": started if started is not None else opened,
                "workers": workers,
                "cores": os.cpu_count(),
                "runs": runs,
            }
        )
        self._write(
            {"event": "phase", "name": "start-up", "start": started or opened, "end": opened, "cpu": cpu_seconds()}
        )

    def _write(self, record: dict) -> None:
        if self.error is not None:
            return
        try:
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"sweep": self.id, **record}) + "\n")
        except OSError as err:
            self.error = f"{self.path}: {err.strerror or err}"

    @contextlib.contextmanager
    def phase(self, name: str):
        start, cpu = time.time(), time.process_time()
        try:
            yield
        finally:
            self._write(
                {"event": "phase", "name": name, "start": start, "end": time.time(), "cpu": time.process_time() - cpu}
            )

    def stack(self, record: dict) -> None:
        self._write({"event": "stack", **record})

    def close(self) -> None:
        self._write(
            {
                "event": "end",
                "end": time.time(),
                "cpu_self": cpu_seconds(),
                "cpu_children": cpu_seconds(resource.RUSAGE_CHILDREN) - self.children_at_open,
            }
        )


def read_timeline(path: Path) -> list[dict]:
    """The records of the last sweep that started in a timeline file (lines that do not parse are skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and "sweep" in record and "event" in record:
                records.append(record)
    starts = [r["sweep"] for r in records if r["event"] == "sweep"]
    return [r for r in records if starts and r["sweep"] == starts[-1]]


# The causes of core-seconds no process spent, in the order summaries give them.
IDLE_CAUSES = {
    "start": "before each worker's first stack (the main process starting, reading and planning; workers spawning)",
    "waiting": "a worker waiting for work between stacks",
    "tail": "a worker with no work left while another still trains (the tail)",
    "end": "after the last stack (the main process's report and figures)",
    "preparing": "a stack's runs being claimed and prepared, off the CPU (their locks, config files' fsyncs)",
    "writes": "a stack's loop waiting on its durable writes (fsync)",
    "other": "the rest: in stacks but off the CPU (other processes' load, page faults), "
    "less the main process's CPU while stacks ran",
}


def summarise(records: list[dict]) -> dict:
    """The sweep's wall time, CPU seconds, cores busy on average and idle
    core-seconds by cause (IDLE_CAUSES), from one sweep's records (read_timeline).

    Each of `workers` slots spends the wall time in stacks or out of them; out
    of them it is idle before its first stack, between stacks, in the tail (after
    its last stack, before the last stack ends) or after the last stack, where
    the main process's CPU in those serial phases (and a worker's before its
    first stack) is taken off the idle time. In stacks it is idle while its
    runs are prepared but for the CPU that takes, and while its loop waits on
    writes. Whatever idle time is left is `other`, so the causes sum to
    workers x wall - CPU."""
    header = next(r for r in records if r["event"] == "sweep")
    stacks = sorted((r for r in records if r["event"] == "stack"), key=lambda r: r["start"])
    phases = {r["name"]: r for r in records if r["event"] == "phase"}
    ending = next((r for r in records if r["event"] == "end"), None)
    t0 = header["start"]
    ends = [r["end"] for r in records if "end" in r]
    t1 = ending["end"] if ending is not None else max(ends, default=t0)
    wall = t1 - t0
    slots = header["workers"]

    by_worker: dict[str, list[dict]] = {}
    for record in stacks:
        by_worker.setdefault(record["worker"], []).append(record)
    worker_cpu = {w: max(r["cpu_total"] for r in rs) for w, rs in by_worker.items()}
    main_cpu = ending["cpu_self"] if ending is not None else sum(r["cpu"] for r in phases.values())
    cpu = main_cpu + max(sum(worker_cpu.values()), ending["cpu_children"] if ending is not None else 0.0)

    last_end = max((r["end"] for r in stacks), default=t0)
    serial_start_cpu = sum(phases[n]["cpu"] for n in ("start-up", "plan") if n in phases)
    before_first = {w: rs[0]["start"] - t0 for w, rs in by_worker.items()}
    worker_cpu_before = {w: max(0.0, rs[0]["cpu_total"] - rs[0]["cpu"]) for w, rs in by_worker.items()}
    # the main process's CPU after the last stack: its phases begun then, and what no phase holds (its last lines)
    unphased = max(0.0, main_cpu - sum(r["cpu"] for r in phases.values()))
    main_cpu_after = unphased + sum(r["cpu"] for r in phases.values() if r["start"] >= last_end)
    idle = {
        "start": sum(before_first.values())
        + (slots - len(by_worker)) * (last_end - t0)
        - serial_start_cpu
        - sum(worker_cpu_before.values()),
        "waiting": sum(b["start"] - a["end"] for rs in by_worker.values() for a, b in zip(rs, rs[1:])),
        "tail": sum(last_end - rs[-1]["end"] for rs in by_worker.values()),
        "end": slots * (t1 - last_end) - main_cpu_after,
        "preparing": sum(
            max(0.0, r["trained"] - r["start"] - r["cpu_preparing"]) for r in stacks if "cpu_preparing" in r
        ),
        "writes": sum(r["writes"] for r in stacks),
    }
    idle["other"] = slots * wall - cpu - sum(idle.values())
    in_stacks = sum(r["end"] - r["start"] for r in stacks)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "cores_busy": cpu / wall if wall > 0 else 0.0,
        "workers": slots,
        "cores": header.get("cores"),
        "runs": header.get("runs"),
        "stacks": len(stacks),
        "main_cpu_s": main_cpu,
        "worker_cpu_s": sum(worker_cpu.values()),
        "stack_seconds": in_stacks,
        "stack_cpu_s": sum(r["cpu"] for r in stacks),
        "preparing_s": sum(r["trained"] - r["start"] for r in stacks),
        "write_moments": sum(len(r.get("write_moments", [])) for r in stacks),
        "efficiency": in_stacks / (wall * slots) if wall > 0 else 0.0,
        "phases": {name: {"seconds": r["end"] - r["start"], "cpu_s": r["cpu"]} for name, r in phases.items()},
        "first_stack_s": min((r["start"] for r in stacks), default=t0) - t0,
        "last_stack_end_s": last_end - t0,
        "core_idle_s": idle,
    }
