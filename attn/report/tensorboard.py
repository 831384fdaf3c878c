"""Runs as TensorBoard event files, written through tensorboard's own protobufs, plugin helpers and record writer.

    attn export RUNS ... --tensorboard DIR     DIR/<run name>/events.out.tfevents.<start>.<host>.attn

One event file per run (the optional `tensorboard` package, attn[tensorboard]) for each dashboard:

    Scalars   each finite metric of each metrics.jsonl record at its step (`eval_loss`, `grad_norm/W_q`, ...),
              and summary.json's best values as `best/<metric>` at the step each was reached
    HParams   a session per run: the flattened config (`model.d_k`, `optim.lr`, ...; a null value left out),
              the run's `status` and, once it has ended, its `outcome`; its metrics are summary.json's final
              ones (the last value of each scalar) and best ones
    Text      `config` (config.yaml), `summary` (summary.json) and `outcome`
    Images    `figures/<name>`: each figure of the run (loss, attention at init and end, ...) at its last step

Beside the runs, DIR/events.out.tfevents.0.experiment.attn holds the HParams experiment: every setting with
the values seen (a string's values, a number's range) and the metrics, for the runs exported now and those it
named before, so the dashboard lists the settings that differ first and shows the headline metrics.

Event times are the run's start plus each record's `wall_time`. Each file is written whole under a temporary
name and renamed over the earlier export (any file of ours, ending in .attn, in its directory), so exporting
again never doubles a curve.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

from attn.analysis import grouping
from attn.config.yamlio import yaml_line
from attn.report.exports import Exported, Found, Written, missing, unreadable
from attn.store import runs

try:  # the optional tensorboard package: write_event_files says how to install it when it is missing
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
    from tensorboard.plugins.hparams import metadata as hparams_metadata
    from tensorboard.plugins.hparams import summary_v2 as hparams_summary
    from tensorboard.plugins.text import summary_v2 as text_summary
    from tensorboard.summary.writer.record_writer import RecordWriter
except ImportError:
    RecordWriter = None

SUFFIX = ".attn"  # ours: replaced by the next export; TensorBoard reads any name holding "tfevents"
EXPERIMENT_FILE = f"events.out.tfevents.0.experiment{SUFFIX}"
FILE_VERSION = "brain.Event:2"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type (grey, RGB, grey and alpha, RGBA) -> channels


def hparams(found: Found) -> dict:
    """The run's HParams: each config value set (null ones left out) as a bool, number or string (a mapping or
    list as YAML writes it), its status and, where it has one, its outcome."""
    values = {
        key: value if isinstance(value, (bool, int, float, str)) else yaml_line(value)
        for key, value in found.run.settings.items()
        if value is not None
    }
    values["status"] = found.run.status
    if found.outcome:
        values["outcome"] = found.outcome
    return values


def best_points(found: Found) -> list[tuple[str, int, float]]:
    """(metric, step, value) of summary.json's best values: `eval_loss` at `eval_loss_step`."""
    best = found.run.summary.get("best") or {}
    return [
        (key, int(best.get(f"{key}_step", found.last_step)), float(value))
        for key, value in best.items()
        if not key.endswith("_step") and runs.is_finite_number(value)
    ]


def headline_metrics(found: Found) -> set[str]:
    """The scalars the HParams dashboard shows for the run: summary.json's final ones and its best values (those
    with the step they were reached at; not `steps_to_99`, which a run that never reached 99% lacks, and the
    parallel coordinates leave out a run lacking one)."""
    final, best = found.run.summary.get("final") or {}, found.run.summary.get("best") or {}
    return {key for key in final if key != "step"} | {f"best/{key}" for key in best if f"{key}_step" in best}


def png_size(data: bytes) -> tuple[int, int, int]:
    """(height, width, channels) from a PNG's header."""
    width, height, _, colour = struct.unpack(">IIBB", data[16:26])
    return height, width, PNG_CHANNELS.get(colour, 4)


def code_block(text: str) -> str:
    """Text that TensorBoard's Markdown shows as it is: each line indented four spaces."""
    return "\n".join("    " + line for line in text.splitlines())


def scalar(tag: str, value: float):
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])


def run_events(found: Found) -> list:
    """The run's Events, in order; OSError when one of its files cannot be read."""
    run, start = found.run, found.started
    end = found.wall_time(run.records[-1]) if run.records else start
    trial = found.name.as_posix()
    session = hparams_summary.hparams_pb(hparams(found), trial_id=trial, start_time_secs=start)
    events = [event_pb2.Event(wall_time=start, summary=session)]
    for record in run.records:
        values = [
            summary_pb2.Summary.Value(tag=key, simple_value=value)
            for key, value in record.items()
            if key != "step" and runs.is_finite_number(value)
        ]
        events.append(
            event_pb2.Event(
                wall_time=found.wall_time(record), step=record["step"], summary=summary_pb2.Summary(value=values)
            )
        )
    for key, step, value in best_points(found):
        events.append(event_pb2.Event(wall_time=end, step=step, summary=scalar(f"best/{key}", value)))
    texts = {
        "config": code_block((run.path / "config.yaml").read_text()),
        "summary": code_block(json.dumps(run.summary, indent=2)),
    }
    if found.outcome:
        texts["outcome"] = found.outcome
    for tag, text in texts.items():
        events.append(event_pb2.Event(wall_time=end, step=found.last_step, summary=text_summary.text_pb(tag, text)))
    for figure in found.figures:
        data = figure.read_bytes()
        if not data.startswith(PNG_SIGNATURE) or len(data) < 26:  # not a PNG, though so named: no image to show
            continue
        height, width, channels = png_size(data)
        image = summary_pb2.Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=data)
        value = summary_pb2.Summary.Value(tag=f"figures/{figure.stem}", image=image)
        events.append(event_pb2.Event(wall_time=end, step=found.last_step, summary=summary_pb2.Summary(value=[value])))
    return events


def _typed(value) -> tuple[str, object]:
    """A value with its kind, so that True and 1 stay apart in a set."""
    if isinstance(value, bool):
        return "bool", value
    return ("number", float(value)) if isinstance(value, (int, float)) else ("string", str(value))


def read_experiment(path: Path):
    """The HParams experiment of an earlier export (EXPERIMENT_FILE), or None."""
    if not path.is_file():
        return None
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            if value.tag == hparams_metadata.EXPERIMENT_TAG:
                return hparams_metadata.parse_experiment_plugin_data(value.metadata.plugin_data.content)
    return None


def experiment_event(found: list[Found], earlier, now: float):
    """The HParams experiment of the runs exported now and those the earlier one named: each setting with its
    values (a discrete domain of strings or booleans, a number's range; a setting of mixed kinds none), whether
    they differ, and the headline metrics."""
    seen: dict[str, set] = {}
    metrics = set()
    for info in earlier.hparam_infos if earlier else ():
        values = seen.setdefault(info.name, set())
        if info.HasField("domain_interval"):
            values |= {("number", info.domain_interval.min_value), ("number", info.domain_interval.max_value)}
        for value in info.domain_discrete.values if info.HasField("domain_discrete") else ():
            kind = value.WhichOneof("kind")
            values.add(("bool", value.bool_value) if kind == "bool_value" else ("string", value.string_value))
    metrics |= {info.name.tag for info in earlier.metric_infos} if earlier else set()
    for one in found:
        for key, value in hparams(one).items():
            seen.setdefault(key, set()).add(_typed(value))
        metrics |= headline_metrics(one)
    infos = []
    for name, values in sorted(seen.items()):
        kinds, plain = {kind for kind, _ in values}, [value for _, value in values]
        info = api_pb2.HParamInfo(name=name, differs=len(values) > 1)
        if kinds == {"number"}:
            hparams_summary.RealInterval(min(plain), max(plain)).update_hparam_info(info)
        elif len(kinds) == 1:
            hparams_summary.Discrete(plain).update_hparam_info(info)
        else:
            info.type = api_pb2.DATA_TYPE_STRING
        infos.append(info)
    experiment = api_pb2.Experiment(
        hparam_infos=infos,
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in sorted(metrics)],
        time_created_secs=now,
    )
    content = plugin_data_pb2.HParamsPluginData(experiment=experiment)
    value = summary_pb2.Summary.Value(
        tag=hparams_metadata.EXPERIMENT_TAG,
        metadata=hparams_metadata.create_summary_metadata(content),
        tensor=hparams_metadata.NULL_TENSOR,
    )
    return event_pb2.Event(wall_time=now, summary=summary_pb2.Summary(value=[value]))


def write_events(events: list, path: Path) -> None:
    """The events as one event file at path (its directory made if need be): written whole, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".attn-export.{os.getpid()}.tmp"  # no "tfevents" in it: TensorBoard never reads it
    try:
        with open(temporary, "wb") as out:
            writer = RecordWriter(out)
            for event in [event_pb2.Event(wall_time=events[0].wall_time, file_version=FILE_VERSION), *events]:
                writer.write(event.SerializeToString())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def require_tensorboard() -> None:
    """MissingLibrary unless the tensorboard package is installed."""
    if RecordWriter is None:
        raise missing("tensorboard", "tensorboard")


def write_event_files(found: list[Found], out_dir: Path) -> Exported:
    """Each run (exports.find_runs) into out_dir/<its name>, and the HParams experiment beside them; a run whose
    files can no longer be read skipped. MissingLibrary without tensorboard; OSError when out_dir cannot be
    written."""
    require_tensorboard()
    out_dir = Path(out_dir)
    written, skipped, exported = [], [], []
    for one in found:
        try:
            events = run_events(one)
        except (OSError, UnicodeDecodeError) as err:  # a file of the run gone or unreadable since it was read
            skipped.append(grouping.Skipped(one.run.path, unreadable(err)))
            continue
        path = out_dir / one.name / f"events.out.tfevents.{int(one.started)}.{socket.gethostname()}{SUFFIX}"
        write_events(events, path)
        for old in path.parent.glob(f"events.out.tfevents.*{SUFFIX}"):  # an earlier export of the run
            if old not in (path, path.parent / EXPERIMENT_FILE):
                old.unlink()
        written.append(Written(one, str(path), len(one.run.records)))
        exported.append(one)
    if exported:
        earlier = read_experiment(out_dir / EXPERIMENT_FILE)
        write_events([experiment_event(exported, earlier, time.time())], out_dir / EXPERIMENT_FILE)
    return Exported(written, skipped)
