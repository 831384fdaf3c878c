"""Children die with their parent (attn.store.processes.run_child, which
`attn verify` starts its `attn sweep` re-runs with): each in its own
process group; a SIGTERM/SIGINT to the parent is passed on and waited for;
a parent killed outright (SIGKILL) takes the child with it (Linux
PR_SET_PDEATHSIG)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from attn.cli import common
from attn.experiment import report_spec
from attn.experiment.spec import load_experiment

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
# Every wait here is for an event (a file written, a process ended), bounded only so that a broken build fails
# rather than hangs: the bound is never reached on a loaded machine, where starting Python alone can take seconds.
PATIENCE = 300  # seconds

# The parent: run_child of a child that records its pid and the signal that ends it, then sleeps.
PARENT = """
import sys
from attn.store import processes
child = ("import os, signal, sys, time;"
         "stop = lambda s, f: (open(sys.argv[1] + '.signal', 'w').write(str(s)), sys.exit(3));"
         "signal.signal(signal.SIGTERM, stop); signal.signal(signal.SIGINT, stop);"
         # its pid once it handles the signals: the test may send them
         "open(sys.argv[1], 'w').write(str(os.getpid()));"
         "time.sleep(120)")
try:
    processes.run_child([sys.executable, "-c", child, sys.argv[1]])
except processes.ChildStopped as stopped:
    print(stopped.signal, stopped.returncode)
    sys.exit(7)
"""


def wait_for(condition, what: str, timeout: float = PATIENCE):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_parent(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(pid_file)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the child to start"))
    return parent, child


@linux
def test_a_child_dies_when_its_parent_is_killed_outright(tmp_path):
    parent, child = start_parent(tmp_path)
    assert os.getpgid(child) == child != os.getpgid(parent.pid), "the child leads its own process group"
    parent.kill()
    parent.wait()
    wait_for(lambda: not alive(child), "the child to end")
    assert (tmp_path / "child.pid.signal").read_text() == str(int(signal.SIGTERM)), "it was asked to stop, not killed"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_parent_is_passed_on_and_waited_for(tmp_path, signum):
    parent, child = start_parent(tmp_path)  # once the child has written its pid, both handle the signals
    parent.send_signal(signum)
    told = tmp_path / "child.pid.signal"  # the child's handler writes the signal it got, then exits 3
    assert wait_for(lambda: told.exists() and told.read_text(), "the child to be told") == str(int(signum))
    out, err = parent.communicate(timeout=PATIENCE)  # the parent ends once the child has
    assert (parent.returncode, out.split(), err) == (7, [signal.Signals(signum).name, "3"], "")
    assert not alive(child)


def test_a_stop_signal_that_comes_while_the_child_starts_is_passed_on_once_it_has(tmp_path):
    """The parent asks itself to stop just before it starts the child (as a
    SIGTERM under load can arrive): the child, once started, is told too."""
    stopped_at_start = PARENT.replace(
        "from attn.store import processes",
        """from attn.store import processes
import os, signal, subprocess
start = subprocess.Popen
def stop_then_start(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return start(*args, **kwargs)
processes.subprocess.Popen = stop_then_start""",
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", stopped_at_start, str(tmp_path / "child.pid")],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = parent.communicate(timeout=PATIENCE)
    assert parent.returncode == 7 and err == "", err  # it waited for the child, which ended
    name, child_returncode = out.split()
    assert name == "SIGTERM" and int(child_returncode) in (-signal.SIGTERM, 3)  # before or after its handler


@linux
def test_a_child_whose_parent_died_as_it_started_ends_before_running_its_command(monkeypatch):
    """die_with's own signal, sent in the child before its exec, ends it (the
    parent's stop handler, inherited across the fork, does not catch it)."""
    from attn.store import processes

    told_dead = processes.die_with
    monkeypatch.setattr(processes, "die_with", lambda parent, signum: told_dead(-1, signum))  # -1: not its parent
    finished = processes.run_child([sys.executable, "-c", "pass"])
    assert finished.returncode == -signal.SIGTERM


def test_a_childs_stderr_lines_are_handed_on_as_they_come_and_returned_whole(tmp_path):
    """on_line sees each line before the child goes on (the child waits for the file the first line's handler
    writes, and fails without it), and the finished process holds them all."""
    from attn.store import processes

    go = tmp_path / "go"
    child = (
        "import os, sys, time; print('first', file=sys.stderr, flush=True);"
        f"deadline = time.monotonic() + {PATIENCE};"
        f"[time.sleep(0.01) for _ in iter(lambda: os.path.exists({str(go)!r}) or time.monotonic() > deadline, True)];"
        f"sys.exit(0 if os.path.exists({str(go)!r}) else 4) if print('second', file=sys.stderr) is None else 5"
    )
    seen = []

    def on_line(line):
        seen.append(line)
        go.touch()

    done = processes.run_child(
        [sys.executable, "-c", child], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, on_line=on_line
    )
    assert (done.returncode, seen, done.stderr) == (0, ["first", "second"], "first\nsecond\n")

    def closed(line):
        raise BrokenPipeError(32, "Broken pipe")  # where the lines went is gone, as `attn verify | head` leaves it

    child = "import sys; sys.stderr.buffer.write(b'one\\xff\\n'); print('two', file=sys.stderr); sys.exit(3)"
    done = processes.run_child(
        [sys.executable, "-c", child], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, on_line=closed
    )
    assert (done.returncode, done.stderr) == (3, "one\ufffd\ntwo\n"), "the child ran to its end, every line kept"
    with pytest.raises(ValueError, match="on_line"):
        processes.run_child([sys.executable, "-c", "pass"], on_line=print)


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose parent is pid."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append((int(stat.parent.name), command))
    return found


def long_tiny_experiment(tmp_path: Path) -> Path:
    """tiny.yaml: one run of tiny shapes and a budget no test waits for (they stop it), checkpointing often."""
    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "base": str(REPO / "configs" / "default.yaml"),
                "grid": {"optim.lr": [0.1]},
                "seeds": [0],
                "overrides": {
                    "model.d_model": 16,
                    "model.d_k": 8,
                    "task.eval_size": 64,
                    "train.batch_size": 16,
                    "train.steps": 200000,
                    "logging.log_every": 1000,
                    "logging.checkpoint_every": 1000,
                    "logging.plots": False,
                    "logging.attention_examples": 0,
                },
            }
        )
    )
    return experiment


@linux
@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_attn_verify_killed_leaves_no_sweep_running(tmp_path, how):
    """`attn verify` stopped while its float64 re-run trains: the child `attn sweep` and its workers end too."""
    experiment = long_tiny_experiment(tmp_path)
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    loaded = load_experiment(experiment, str(tmp_path / "runs"))
    digest = report_spec.claims_record(loaded.report, {c.seed for c in loaded.cells})["digest"]
    (tmp_path / "runs" / "tiny" / "report.json").write_text(
        json.dumps(  # as if swept: its one run finished (what verify reads of a report: verify.REPORT_READ)
            {
                "expectations": [],
                "claims": {"digest": digest},
                "platform": {},
                "cells": [{"n": 1, "unfinished": {}, "settings": {}, "success_rate": {"k": 0, "n": 1}, "seeds": []}],
            }
        )
    )
    verify = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attn",
            "verify",
            str(experiment),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--workers",
            "1",
        ],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sweep = wait_for(
        lambda: next((pid for pid, command in children_of(verify.pid) if " sweep " in command), None), "verify's sweep"
    )
    metrics = tmp_path / "runs" / "verify" / "float64" / "tiny"
    wait_for(lambda: any(metrics.glob("*/checkpoint.npz")), "the re-run to train")
    workers = [pid for pid, _ in children_of(sweep)]
    assert workers, "the sweep's worker"
    if how == "SIGKILL":
        verify.kill()
        verify.wait()
    else:
        verify.terminate()
        _, err = verify.communicate(timeout=PATIENCE)
        assert verify.returncode == common.EXIT_SIGNAL["SIGTERM"], err
        assert err.splitlines()[-1].startswith("stopped by SIGTERM:") and "resume" in err.splitlines()[-1], err
        assert "Traceback" not in err
    for pid in (sweep, *workers):
        wait_for(lambda: not alive(pid), f"process {pid} to end")
    summaries = [json.loads(p.read_text()) for p in metrics.glob("*/summary.json")]
    assert [s["status"] for s in summaries] == ["interrupted"], "the sweep checkpointed its run as it stopped"


@linux
@pytest.mark.slow
def test_a_sweep_killed_outright_takes_its_workers_with_it(tmp_path):
    """SIGKILL of `attn sweep`: its worker dies too (it trained on, then waited forever on a queue no one fed,
    holding its runs, so the sweep again saw them 'running in another sweep'); the run is left stale, to resume."""
    experiment = long_tiny_experiment(tmp_path)
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attn",
            "sweep",
            str(experiment),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--workers",
            "1",
        ],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: any((tmp_path / "runs" / "tiny").glob("*/checkpoint.npz")), "the run to train")
    workers = [pid for pid, command in children_of(sweep.pid) if "resource_tracker" not in command]
    assert workers, "the sweep's worker"
    sweep.kill()
    sweep.wait()
    for pid in workers:
        wait_for(lambda: not alive(pid), f"worker {pid} to end")


def test_a_process_that_ended_but_was_not_yet_reaped_is_not_alive():
    """A zombie (dead, its parent not yet waiting on it) holds no run: a killed run's writer in that state
    must not keep --resume refusing it as 'still running'."""
    from attn.store.processes import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: not alive(child.pid), "the child to end")  # ended, not reaped: a zombie
    assert Path(f"/proc/{child.pid}").exists() and not pid_alive(child.pid)
    child.wait()
