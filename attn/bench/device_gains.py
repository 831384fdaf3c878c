"""What each fast-path device (attn.bench.devices) saves, measured side by side with it switched off.

- steps: at each of `make bench`'s sizes (one run, one training step a call) and at each d_k of the
  headline (a stack of the members the sweep's plan gives it, LOG_EVERY training steps and the eval the loop
  makes on its logged step a call), the device on and, in the same alternating rounds
  (attn.bench.timing.time_interleaved), each device off alone, all devices off together (the width-free
  head aside: the headline's widest cells need it) and a second copy of "on" (the control: its ratio is the
  noise of the measurement). Per cell: each side's median over the "on" median. The headline's share
  of a device: its extra time at each d_k, per member-step, summed over the d_k (every d_k holds the same
  member-steps in the headline) over the same sum with every device on.
- sweeps: the headline's part that --only leaves swept as `attn sweep` sweeps it (attn.bench.sweeps),
  with the devices that act outside the step (flush-to-zero in trained runs, the allocator) off in every
  process, and with every device off together, alternating with all on.

The table (attn.bench.device_gains.table) gives each device's gains and its verdict under issue 48's rule.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from attn import optim
from attn.bench import devices, timing
from attn.bench.devices import BY_KEY, DEVICES
from attn.model import fast
from attn.store import runstate
from attn.train import allocator, denormals
from attn.train.stack import Stack, members_per_stack

HEADLINE = timing.REPO / "experiments" / "sqrt_dk.yaml"
HEADLINE_D_K = (16, 64, 256, 1024, 4096, 16384, 65536, 1 << 20)
MATERIALIZED_UP_TO = 1 << 16  # the width-free head is switched off at most this wide: at 2^20 a run needs GiBs
STEP_DEVICES = tuple(d.key for d in DEVICES if d.scope in ("step", "build") or d.key == "ftz")
ALL_OFF = "all off"  # every step device off together but the width-free head
CONTROL = "on (again)"
# Devices off together beside each alone: those issue 48's rule would remove, whose removal together must cost
# at most REMOVED_AT_MOST of the headline.
TOGETHER = {}
REMOVE_BELOW = 0.05  # issue 48: a device saving less than this share of the headline is removed ...
REMOVED_AT_MOST = 0.10  # ... as long as all removed together cost at most this share of it
# Those whose share of the headline only a sweep measures: flush-to-zero acts in trained, saturated runs (the steps
# time runs near their start, where no gradient is subnormal yet), the allocator on a worker's whole heap, over
# every stack it trains. The fsync pool was measured so too, and removed (docs/bench.md keeps its row).
SWEEP_DEVICES = ("ftz", "allocator")
SWEEP_ONLY = (*SWEEP_DEVICES, "fsyncpool")
ROUNDS, CALLS, WARMUP = 8, 2, 2  # the steps' alternating rounds, calls of each side a round, untimed calls first


def _stepper(step: Callable[[], None], off: tuple[str, ...]) -> Callable[[], None]:
    """step() with the devices `off` switched off around it, and flushing subnormals as training does."""

    def call():
        with devices.switched_off(off):
            with denormals.flushing():  # looked up now: switched off, it keeps subnormals
                step()

    return call


def size_step(name: str, off: tuple[str, ...]) -> Callable[[], None]:
    """One training step of `make bench`'s size `name` (its own run), built with `off` switched off."""
    config = timing.size_config(name)
    with devices.switched_off([k for k in off if BY_KEY[k].scope == "build"]):
        task, spec, params, optimizer, gens = runstate.build(config)
    return timing.attn_stepper(config, spec, params, optimizer, timing.batch_pool(task, gens, config))


LOG_EVERY = 10  # the headline's logging.log_every: a call is this many steps and one eval


def headline_stack_configs(d_k: int, width_free: bool = True) -> list:
    """The configs of the headline's first planned stack at `d_k` (attn.experiment.sweep.plan_stacks): its
    scales, rates and seeds mixed as the sweep mixes them; without the width-free head, as many as would
    stack materialized (members_per_stack)."""
    from attn.experiment.spec import load_experiment
    from attn.experiment.sweep import plan_stacks

    experiment = load_experiment(HEADLINE, runs_dir=tempfile.gettempdir(), only=(f"model.d_k={d_k}",))
    stack = [c.config for c in plan_stacks(experiment.cells)[0]]
    if not width_free:
        with devices.switched_off(["widthfree"]):
            stack = stack[: members_per_stack(stack[0])]
    return stack


def headline_step(d_k: int, off: tuple[str, ...]) -> tuple[Callable[[], None], int]:
    """(call, members): LOG_EVERY training steps of a stack of the headline's cells at `d_k`, then the
    eval the loop makes at a logged step (forward on the eval sets, diagnostics, gradient norms)."""
    configs = headline_stack_configs(d_k, width_free="widthfree" not in off)
    with devices.switched_off([k for k in off if BY_KEY[k].scope == "build"]):
        with tempfile.TemporaryDirectory() as tmp:  # prepare writes nothing
            states = [runstate.prepare(c, Path(tmp) / str(i)) for i, c in enumerate(configs)]
        stack = Stack(states)
    task, lrs = states[0].task, np.array([c.optim.lr for c in configs])
    gens = [s.gens.data for s in states]

    def call():
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for _ in range(LOG_EVERY):
                batch = task.sample_stack(gens, configs[0].train.batch_size)
                loss, grads, cache = fast.loss_and_grads(stack.params, stack.spec, batch, stack.scales, stack.buffers)
                stack.optimizer.step(stack.params, grads, lrs)
            eval_loss, eval_cache = fast.forward(stack.params, stack.spec, stack.eval_batch, scale=stack.scales)
            fast.diagnostics(eval_cache, stack.eval_batch)
            fast.accuracy(cache, batch)
            {n: optim.squared_norms(g) for n, g in grads.items()}

    return call, len(configs)


def sides(keys: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """side name -> the devices it switches off: on, each alone, all off (the width-free head kept), the control;
    with no devices, "on" alone."""
    if not keys:
        return {"on": ()}
    return {
        "on": (),
        **{k: (k,) for k in keys},
        ALL_OFF: tuple(k for k in keys if k != "widthfree"),
        **{name: together for name, together in TOGETHER.items() if set(together) <= set(keys)},
        CONTROL: (),
    }


def measure_cell(
    build: Callable[[tuple[str, ...]], tuple[Callable, int]],
    keys: tuple[str, ...],
    rounds: int,
    calls: int,
    warmup: int,
    what: str,
    progress,
    slow: tuple[str, ...] = (),
) -> dict:
    """Every side of `sides(keys)` built by build(off) -> (call, members), timed in `rounds` alternating
    rounds of `calls` calls each (one a round for the `slow` sides): each side's median seconds per call, and
    its ratio to every device on per member-call: in each round, the side's median over the median of the
    two "on" copies' calls in that round (the control's over the first copy's alone), then the median over
    the rounds, so that a slow spell of the machine, which both sides of a round share, cancels. Seconds of
    this process's CPU (it computes in one thread): on a loaded machine the wall time holds the waits for a
    core, as much noise as a small device's gain."""
    built = {name: build(off) for name, off in sides(keys).items()}
    steppers = {name: _stepper(call, sides(keys)[name]) for name, (call, _) in built.items()}
    for name, step in steppers.items():
        for _ in range(1 if name in slow else warmup):
            step()
    progress(f"{what}: timing {len(steppers)} sides in {rounds} rounds")
    work = {name: (step, 1 if name in slow else calls) for name, step in steppers.items()}
    times = timing.time_interleaved(work, rounds, time.process_time)

    def in_round(name: str, r: int) -> list[float]:
        n = work[name][1]
        return times[name][r * n : (r + 1) * n]

    references = {name: ("on",) if name == CONTROL or CONTROL not in times else ("on", CONTROL) for name in times}
    on = float(np.median(times["on"] + times.get(CONTROL, []))) / built["on"][1]
    result = {}
    for name, seconds in times.items():
        ratios = [
            float(np.median(in_round(name, r)))
            / built[name][1]
            / (float(np.median([t for ref in references[name] for t in in_round(ref, r)])) / built["on"][1])
            for r in range(rounds)
        ]
        ratio = 1.0 if name == "on" else float(np.median(ratios))
        result[name] = {
            "median_s": float(np.median(seconds)),
            "members": built[name][1],
            "per_member_s": ratio * on,
            "ratio": ratio,
            "round_ratios": ratios,
            "n": len(seconds),
        }
    return result


def measure_steps(
    sizes: list[str], d_ks: list[int], rounds: int, calls: int, warmup: int, progress, keys=STEP_DEVICES
) -> dict:
    """measure_cell at each bench size (a step a call, LOG_EVERY times the calls) and each headline d_k (a stack,
    LOG_EVERY steps a call)."""
    denormals.set_flushing(False)  # this thread keeps subnormals unless a side flushes them, as training does
    allocator.keep_freed_memory()  # as every stack of runs does
    result = {"sizes": {}, "headline": {}}
    for name in sizes:
        result["sizes"][name] = measure_cell(
            lambda off: (size_step(name, off), 1), keys, rounds, calls * LOG_EVERY, warmup, name, progress
        )
    for d_k in d_ks:
        here = tuple(k for k in keys if k != "widthfree" or d_k <= MATERIALIZED_UP_TO)
        slow = ("widthfree",) if d_k > 1 << 14 else ()  # materialized, a call takes seconds
        result["headline"][str(d_k)] = measure_cell(
            lambda off: headline_step(d_k, off), here, rounds, calls, warmup, f"d_k {d_k}", progress, slow
        )
    return result


def headline_share(headline: dict, side: str) -> float | None:
    """The headline's extra time with `side` off, as a share of its time with every device on: the extra
    per member-step (its ratio less one, times "on") summed over its d_k (each holds the same member-steps),
    over the sum of "on"; over the d_k where `side` was measured."""
    measured = [cell for cell in headline.values() if side in cell]  # the width-free head: not off at 2^20
    if not measured:
        return None
    on = sum(cell["on"]["per_member_s"] for cell in measured)
    return sum(cell["on"]["per_member_s"] * (cell[side]["ratio"] - 1) for cell in measured) / on


def measure_sweeps(only: tuple[str, ...], rounds: int, progress) -> dict:
    """The headline's `only` part swept as `attn sweep` sweeps it: all on, each of SWEEP_DEVICES off, every
    device off (the width-free head kept), alternating in `rounds` rounds (the order turned each round)."""
    from attn.bench import sweeps

    variants = {"on": (), **{k: (k,) for k in SWEEP_DEVICES}, ALL_OFF: tuple(k for k in BY_KEY if k != "widthfree")}
    measured = {name: [] for name in variants}
    for round_ in range(rounds):
        order = list(variants) if round_ % 2 == 0 else list(variants)[::-1]
        for name in order:
            said = "every device on" if name == "on" else name if name == ALL_OFF else f"{name} off"
            progress(f"sweep {' '.join(only)} with {said}, round {round_ + 1} of {rounds}")
            with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
                env = devices.sweep_environment(variants[name], Path(tmp), timing.REPO) if variants[name] else None
                swept = sweeps.headline_sweep(Path(tmp) / "runs", os.cpu_count() or 1, only, env=env)
            if swept["exit_code"] != 0:
                raise RuntimeError(f"the sweep with {name} off failed: {' | '.join(swept['error'] or [])}")
            measured[name].append({k: swept[k] for k in ("wall_s", "cpu_s", "cores_busy")})
    on = float(np.median([m["wall_s"] for m in measured["on"]]))
    return {
        "only": list(only),
        "rounds": rounds,
        "variants": {
            name: {
                "off": list(keys),
                "wall_s": float(np.median([m["wall_s"] for m in measured[name]])),
                "ratio": float(np.median([m["wall_s"] for m in measured[name]])) / on,
                "measured": measured[name],
            }
            for name, keys in variants.items()
        },
    }


def verdicts(result: dict) -> dict[str, str]:
    """Each device's verdict under issue 48's rule: removed if it saves less than REMOVE_BELOW of the headline
    (its share, from the sweeps where it acts outside the step, else from the steps) and is not required;
    kept otherwise. Whether all removed together stay within REMOVED_AT_MOST is the all-off side's."""
    said = {}
    for key, device in devices_now(result).items():
        share = device_share(result, key)
        if device.get("required"):
            said[key] = "keep (required)"
        elif share is None:
            said[key] = "keep (not measured: a sweep measures it, --only)"
        elif share >= REMOVE_BELOW:
            said[key] = "keep"
        else:
            said[key] = "remove"
    return said


def devices_now(result: dict) -> dict[str, dict]:
    """The devices the result measured, each with what this checkout says of it: why it is required (if it
    is), and whether it is still here (`now`: kept, or removed since the measurement)."""
    order = [d.key for d in DEVICES]
    measured = sorted(result["devices"], key=lambda key: (order.index(key) if key in order else len(order), key))
    return {
        key: {
            **result["devices"][key],
            **({"required": BY_KEY[key].required} if key in BY_KEY else {}),
            "now": "kept" if key in BY_KEY else "removed",
        }
        for key in measured
    }


def device_share(result: dict, key: str) -> float | None:
    """The headline's extra time with device `key` off: from the sweeps for those measured there, else the steps."""
    sweeps = result.get("sweeps", {})
    for swept in (sweeps, *sweeps.get("earlier", [])):
        if key in swept.get("variants", {}):
            return swept["variants"][key]["ratio"] - 1
    if key in SWEEP_ONLY:
        return None
    if key in result.get("steps", {}).get("headline", {}).get(str(HEADLINE_D_K[0]), {}):
        return headline_share(result["steps"]["headline"], key)
    return None


def _percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{(ratio - 1) * 100:+.0f}%"


def table(result: dict) -> str:
    """The devices' table (Markdown): each device, what off means, its step-time change off at each bench size and
    headline d_k, its share of the headline, and the verdict; then the all-off and control rows, and the sweeps."""
    steps = result.get("steps", {})
    sizes = {name: steps["sizes"][name] for name in timing.SIZES if name in steps.get("sizes", {})}
    cells = {d_k: steps["headline"][d_k] for d_k in sorted(steps.get("headline", {}), key=int)}
    said = verdicts(result)
    header = [
        "device",
        "off: its plain alternative",
        *[f"{name}" for name in sizes],
        *[f"d_k {d_k}" for d_k in cells],
        "headline share",
        "verdict (issue 48's rule)",
        "in this checkout",
    ]

    def row(key: str, name: str, off: str, verdict: str, now: str = "—") -> list[str]:
        share = device_share(result, key) if key in result["devices"] else headline_share(cells, key)
        timed = key not in SWEEP_ONLY or key in STEP_DEVICES  # one that acts on the whole process: its sweep alone
        return [
            name,
            off,
            *[_percent(sizes[s][key]["ratio"]) if timed and key in sizes[s] else "—" for s in sizes],
            *[_percent(cells[c][key]["ratio"]) if timed and key in cells[c] else "—" for c in cells],
            "—" if share is None else f"{share * 100:+.1f}%",
            verdict,
            now,
        ]

    rows = [
        row(key, d["name"], d["off"], said[key] + (f": {d['required']}" if d.get("required") else ""), d["now"])
        for key, d in devices_now(result).items()
    ]
    together = [
        side for side in next(iter(cells.values()), {}) if side not in (*result["devices"], "on", ALL_OFF, CONTROL)
    ]
    rows += [row(side, f"{side} off together", "each of these off, all at once", "—") for side in together]
    rows.append(row(ALL_OFF, "all of them off", "every device above off together but the width-free head", "—"))
    rows.append(row(CONTROL, "none off (control)", "a second copy of the on side: the noise", "—"))
    from attn.text import markdown_table

    lines = [
        f"Measured on {result['machine']}, {steps.get('runs', 1)} time(s), the newest {result['date']}, attn "
        f"{', '.join(map(str, result.get('commits') or [result['attn_commit']]))} (one library code), "
        f"1 thread. Each cell: the time with the device off over the time with every device on, minus one "
        f"(+12% = the device saves 12%), median over {steps.get('runs', 1)} measurement(s) of that code of each's "
        f"median of {steps.get('rounds', '?')} alternating rounds; the bench "
        f"sizes a training step, the headline's d_k a stack of its cells ({LOG_EVERY} steps and an eval). The "
        "headline share: the extra time per member-step summed over its d_k, over the same sum with every "
        "device on" + (" (for the devices also swept, the sweep's wall time)." if result.get("sweeps") else "."),
        "",
        markdown_table(header, rows),
    ]
    sweeps = result.get("sweeps")
    if sweeps:
        lines += ["", sweep_line(sweeps, "The headline's")]
        for earlier in sweeps.get("earlier", []):
            lines += [
                "",
                sweep_line(earlier, f"Earlier, by attn {earlier['attn_commit']} on {earlier['date']}, the headline's"),
            ]
    removed = sorted(key for key, d in devices_now(result).items() if d["now"] == "removed")
    side = next((t for t in together if sorted(t.split(", ")) == removed), None)
    if side is not None:
        share = headline_share(cells, side)
        lines += [
            "",
            f"The devices removed in this checkout ({', '.join(removed)}), off together side by side with all on: "
            f"{share * 100:+.1f}% of the headline ({'within' if share <= REMOVED_AT_MOST else 'NOT within'} "
            f"issue 48's {REMOVED_AT_MOST:.0%} for all removals together).",
        ]
    code = result.get("code")
    if code:
        lines += ["", code_line({"this": result["attn_commit"], **code})]  # newest() names the commit itself
    return "\n".join(lines) + "\n"


def sweep_line(sweeps: dict, opening: str) -> str:
    """One sweep measurement's wall times: all on, then each variant's and its ratio to all on."""
    parts = [
        f"{name}{'' if name == ALL_OFF else ' off'} {v['wall_s']:.0f} s ({_percent(v['ratio'])})"
        for name, v in sweeps["variants"].items()
        if name != "on"
    ]
    return (
        f"{opening} `--only {' '.join(sweeps['only'])}` swept as `attn sweep` sweeps it on every core, median of "
        f"{sweeps['rounds']} alternating rounds: all on {sweeps['variants']['on']['wall_s']:.0f} s; "
        + "; ".join(parts)
        + "."
    )


def joined_sweeps(results: list[dict]) -> dict:
    """The newest result's sweeps, with `earlier`: each older result's sweeps of the devices that no newer one
    swept (beside its own all-on side), so that a device measured once keeps its figure until measured again."""
    joined = dict(results[-1]["sweeps"])
    seen = set(joined["variants"])
    earlier = []
    for result in reversed(results[:-1]):
        swept = result["sweeps"]
        new = {k: v for k, v in swept["variants"].items() if k not in seen and k not in ("on", ALL_OFF)}
        if new:
            on = swept["variants"]["on"]
            earlier.append(
                {**swept, "variants": {"on": on, **new}, "attn_commit": result["attn_commit"], "date": result["date"]}
            )
            seen |= set(new)
    if earlier:
        joined["earlier"] = earlier
    return joined


def code_line(code: dict) -> str:
    """All removed against none: this checkout's step over the other's at each cell, the headline's share, and
    the sweeps of both when measured."""
    ordered = [*[s for s in timing.SIZES if s in code["sizes"]], *sorted(code["headline"], key=int)]
    cells = [f"{name} {_percent({**code['sizes'], **code['headline']}[name]['ratio'])}" for name in ordered]
    cells = [f"d_k {text}" if text[0].isdigit() else text for text in cells]
    share = code.get("headline_share")
    line = (
        f"All removed against none, process against process: every device on, attn {code.get('this')}'s library "
        f"against {code['other']}'s in alternating children ({code['rounds']} rounds: noisier than sides of one "
        "process), its time over the other's minus one: "
        + ", ".join(cells)
        + ("" if share is None else f"; the headline's share {share * 100:+.1f}%")
    )
    sweep = code.get("sweep")
    if sweep:
        walls = {}
        for m in sweep["measured"]:
            walls.setdefault(m["code"], []).append(m["wall_s"])
        this, other = (float(np.median(walls[k])) for k in walls)
        line += (
            f"; the headline's `--only {' '.join(sweep['only'])}` swept on {sweep['workers']} workers, median of "
            f"{len(walls[next(iter(walls))])}: {this:.0f} s against {other:.0f} s ({_percent(this / other)})"
        )
    return line + "."


def write_devices(result: dict, out_dir: Path) -> dict[str, Path]:
    """devices-<time>.json and .md (its table) in out_dir; their paths."""
    from attn.store import runs

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"devices-{time.strftime('%Y%m%d-%H%M%S')}"
    runs.write_json(stem.with_suffix(".json"), result)
    runs.write_atomic(stem.with_suffix(".md"), table(result).encode())
    return {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md")}


def newest(out_dir: Path) -> dict | None:
    """The step measurements in out_dir (devices-*.json) of the newest one's library code (_library), pooled
    (pooled_steps), its commits listed (`commits`); the code comparison of the newest made by this checkout's
    library;
    with the sweeps of the newest result that has them, and each device's sweep that only an older one has
    (joined_sweeps), and the code comparison of the newest (measured later than the steps, or earlier, they
    join them); None if no result has steps."""
    results = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("devices-*.json"))]
    with_steps = [r for r in results if r.get("steps")]
    with_sweeps = [r for r in results if r.get("sweeps")]
    here = _library({"attn_commit": "HEAD"})
    with_code = [r for r in results if r.get("code") and _library(r) == here]  # of this checkout's library alone
    if not with_steps:
        return None
    same = [
        r for r in with_steps if _library(r) == _library(with_steps[-1]) and r["devices"] == with_steps[-1]["devices"]
    ]
    return {
        **with_steps[-1],
        "commits": sorted({r["attn_commit"] for r in same}),
        "steps": pooled_steps([r["steps"] for r in same]),
        **({"sweeps": joined_sweeps(with_sweeps)} if with_sweeps else {}),
        **({"code": {**with_code[-1]["code"], "this": with_code[-1]["attn_commit"]}} if with_code else {}),
    }


LIBRARY = (
    "attn/model",
    "attn/train",
    "attn/optim.py",
    "attn/tasks.py",
    "attn/config",
    "attn/store",
)  # what a step runs


def _library(result: dict) -> tuple:
    """What code a result's steps ran: the git trees of LIBRARY at the commit it measured (so that measurements of
    commits that differ in the bench's own code or the docs pool), or the commit itself where git cannot tell. Its
    working tree's changes aside: a measurement writes docs/bench.md, so the next one of the same commit finds its
    tree dirty."""
    commit = (result.get("attn_commit") or "").removesuffix("-dirty")
    try:
        trees = subprocess.run(
            ["git", "rev-parse", *(f"{commit}:{path}" for path in LIBRARY)],
            cwd=timing.REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return (commit,)
    return tuple(trees.stdout.split()) if commit and trees.returncode == 0 else (commit,)


def pooled_steps(measured: list[dict]) -> dict:
    """Step measurements of one code pooled: each side's ratio at each cell the median over the measurements,
    every device on the median seconds per member-call; `runs` how many were pooled."""
    last = measured[-1]
    pooled = {"rounds": last.get("rounds"), "runs": len(measured)}
    for part in ("sizes", "headline"):
        pooled[part] = {}
        for cell, sides_ in last.get(part, {}).items():
            pooled[part][cell] = {}
            for side in sides_:
                found = [m[part][cell][side] for m in measured if side in m.get(part, {}).get(cell, {})]
                pooled[part][cell][side] = {
                    "ratio": float(np.median([f["ratio"] for f in found])),
                    "per_member_s": float(np.median([f["per_member_s"] for f in found])),
                    "n": len(found),
                }
    return pooled


def _child_main(argv: list[str] | None = None) -> int:
    """python -m attn.bench.device_gains: measure_steps at one BLAS thread, progress lines, then one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m attn.bench.device_gains")
    parser.add_argument("--sizes", default=",".join(timing.SIZES))
    parser.add_argument("--d-k", default=",".join(map(str, HEADLINE_D_K)))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--devices", default=",".join(STEP_DEVICES))
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        result = measure_steps(
            [s for s in args.sizes.split(",") if s],
            [int(d) for d in args.d_k.split(",") if d],
            args.rounds,
            args.calls,
            args.warmup,
            lambda message: print(f"{timing.PROGRESS_PREFIX}{message}", flush=True),
            tuple(k for k in args.devices.split(",") if k),
        )
    print(json.dumps({**result, "rounds": args.rounds}), flush=True)
    return 0


def steps_in_child(
    sizes,
    d_ks,
    rounds: int,
    calls: int,
    warmup: int,
    progress,
    keys=STEP_DEVICES,
    code: Path = timing.REPO,
) -> dict:
    """measure_steps in a fresh one-thread child (as attn.bench.timing.timed_in_child), its progress passed on;
    `code`: the checkout whose attn it runs."""
    command = [sys.executable, "-m", "attn.bench.device_gains", "--sizes", ",".join(sizes)]
    command += ["--d-k", ",".join(map(str, d_ks)), "--rounds", str(rounds), "--calls", str(calls)]
    command += ["--warmup", str(warmup), "--devices", ",".join(keys)]
    child = subprocess.Popen(
        command,
        cwd=code,
        env={**timing.child_environment(1), "PYTHONPATH": str(code)},  # that checkout's attn, not this one's
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    result, other = None, []
    for line in child.stdout:
        if line.startswith("{"):
            result = json.loads(line)
        elif line.startswith(timing.PROGRESS_PREFIX):
            progress(line.removeprefix(timing.PROGRESS_PREFIX).rstrip())
        else:
            other = (other + [line.rstrip()])[-5:]
    if child.wait() != 0 or result is None:
        raise RuntimeError(f"the devices' timing child failed: {' | '.join(other)}")
    return result


MEASURING_CODE = ("attn/bench/devices.py", "attn/bench/device_gains.py", "attn/bench/timing.py")


def code_steps(other: Path, sizes, d_ks, rounds: int, calls: int, warmup: int, progress) -> dict:
    """Every device on, this checkout's library against `other`'s (a checkout made before devices were
    removed: all removed against none), in fresh children alternating for `rounds` rounds (the order turned
    each round), each measuring with this checkout's MEASURING_CODE (copied into `other`): per cell, this
    checkout's median per member-call over the other's, and the headline's share (headline_share)."""
    import shutil

    for path in MEASURING_CODE:
        shutil.copyfile(timing.REPO / path, Path(other) / path)
    measured = {"this": [], "other": []}
    for round_ in range(rounds):
        for variant in ("this", "other") if round_ % 2 == 0 else ("other", "this"):
            progress(f"every device on, {variant} checkout, round {round_ + 1} of {rounds}")
            code = timing.REPO if variant == "this" else Path(other).resolve()
            measured[variant].append(steps_in_child(sizes, d_ks, 1, calls, warmup, progress, (), code=code))
    cells = {}
    for part in ("sizes", "headline"):
        cells[part] = {}
        for cell in measured["this"][0][part]:
            this, that = (
                float(np.median([m[part][cell]["on"]["per_member_s"] for m in measured[v]])) for v in ("this", "other")
            )
            cells[part][cell] = {"this_s": this, "other_s": that, "ratio": this / that}
    shares = {
        c: {"on": {"per_member_s": v["other_s"]}, "this": {"ratio": v["ratio"]}} for c, v in cells["headline"].items()
    }
    return {
        "other": str(other),
        "rounds": rounds,
        **cells,
        "headline_share": headline_share(shares, "this") if shares else None,
    }


def measure_devices(
    sizes,
    d_ks,
    rounds: int,
    calls: int,
    warmup: int,
    progress,
    only: tuple[str, ...] = (),
    sweep_rounds: int = 0,
    other: Path | None = None,
) -> dict:
    """The devices' result: the steps (steps_in_child), or with `only` the sweeps (measure_sweeps);
    with `other` (a checkout before devices were removed) instead this checkout against it (code_steps, and
    with `only` the sweep of both, attn.bench.sweeps.headline_wall_time)."""
    from attn.train import lifecycle

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "attn_commit": lifecycle.source_revision(),
        "machine": f"{lifecycle.cpu_model()}",
        "devices": {
            d.key: {"name": d.name, "where": d.where, "off": d.off, "scope": d.scope, "required": d.required}
            for d in DEVICES
        },
        "steps": steps_in_child(sizes, d_ks, rounds, calls, warmup, progress)
        if (sizes or d_ks) and not other and not only
        else {},
    }
    if other is not None:
        result["code"] = code_steps(other, sizes, d_ks, max(rounds // 2, 2), calls, warmup, progress)
        if only:
            from attn.bench import sweeps

            result["code"]["sweep"] = sweeps.headline_wall_time(progress, only, (other,), max(sweep_rounds, 2))
        return result
    if only and sweep_rounds:
        result["sweeps"] = measure_sweeps(only, sweep_rounds, progress)
    return result


if __name__ == "__main__":
    sys.exit(_child_main())
