"""Runs' metrics as TensorBoard event files, written by hand: no TensorFlow, TensorBoard or protobuf.

    attn export RUNS ... --tensorboard DIR     DIR/<run name>/events.out.tfevents.<time>.<host>.attn

An event file is a sequence of TFRecords: a little-endian uint64 length, the masked CRC32C of
those 8 bytes, the data, and the masked CRC32C of the data. Each record holds one `Event`
protobuf (tensorflow/core/util/event.proto): the first a `file_version` of "brain.Event:2", then
one per logged step with `wall_time`, `step` and a `Summary` whose values are `simple_value`
scalars, one per metric of that record (each finite number but `step`; a metric missing or null
at a step is left out there). Encoded with exactly the fields that TensorBoard's scalar reader
needs:

    Event:   1 wall_time (double)  2 step (int64)  3 file_version (string)  5 summary (Summary)
    Summary: 1 value (repeated Value)
    Value:   1 tag (string)  2 simple_value (float)

wall_time is config.yaml's modification time (when the run was created) plus the record's own
`wall_time` (seconds since the run started) where it has one. A run's earlier export (a file
ending in .attn in its directory under DIR) is replaced, so exporting again never doubles a curve.
read_events reads such files back, checking every CRC (a test vector and, where TensorBoard is
installed, its own reader hold it to the format).
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from attn.analysis import grouping
from attn.store import runs

FILE_VERSION = "brain.Event:2"
SUFFIX = ".attn"  # ours: replaced by the next export; TensorBoard reads any name holding "tfevents"


# ---------------------------------------------------------------------------
# TFRecord framing
# ---------------------------------------------------------------------------
def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it: crc32c(b"123456789") == 0xE3069283."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One TFRecord."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


# ---------------------------------------------------------------------------
# The protobuf, by hand
# ---------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64: negative numbers as ten bytes, as protobuf encodes them
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_event(
    wall_time: float, step: int = 0, scalars: dict | None = None, file_version: str | None = None
) -> bytes:
    """An Event: wall_time, step, and a file_version or a Summary of simple_value scalars."""
    out = b"\x09" + struct.pack("<d", wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, values)
    return out


# ---------------------------------------------------------------------------
# Reading back
# ---------------------------------------------------------------------------
class EventFileError(ValueError):
    """A damaged event file: a short record or a CRC that does not match; str() names the file and offset."""


@dataclass(frozen=True)
class Event:
    wall_time: float
    step: int
    file_version: str | None
    scalars: dict  # tag -> simple_value


def _fields(data: bytes):
    """(field number, wire type, value) of each field of a protobuf message."""
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _read_varint(data, at)
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        elif wire == 2:
            length, at = _read_varint(data, at)
            value, at = data[at : at + length], at + length
        elif wire == 5:
            value, at = data[at : at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}: not read")
        yield number, wire, value


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def decode_event(data: bytes) -> Event:
    wall_time, step, version, scalars = 0.0, 0, None, {}
    for number, _, value in _fields(data):
        if number == 1:
            wall_time = struct.unpack("<d", value)[0]
        elif number == 2:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3:
            version = value.decode()
        elif number == 5:
            for summary_number, _, entry in _fields(value):
                if summary_number != 1:
                    continue
                tag, simple = None, None
                for value_number, wire, item in _fields(entry):
                    if value_number == 1:
                        tag = item.decode()
                    elif value_number == 2 and wire == 5:
                        simple = struct.unpack("<f", item)[0]
                if tag is not None and simple is not None:
                    scalars[tag] = simple
    return Event(wall_time, step, version, scalars)


def read_events(path: Path) -> list[Event]:
    """Every event of an event file, each record's CRCs checked (EventFileError if one fails)."""
    data, at, events = Path(path).read_bytes(), 0, []
    while at < len(data):
        if at + 12 > len(data):
            raise EventFileError(f"{path}: offset {at}: a record's header is cut short")
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        if struct.unpack("<I", data[at + 8 : at + 12])[0] != masked_crc(header):
            raise EventFileError(f"{path}: offset {at}: the length's CRC does not match")
        body = data[at + 12 : at + 12 + length]
        crc = data[at + 12 + length : at + 16 + length]
        if len(body) != length or len(crc) != 4:
            raise EventFileError(f"{path}: offset {at}: a record is cut short")
        if struct.unpack("<I", crc)[0] != masked_crc(body):
            raise EventFileError(f"{path}: offset {at}: the data's CRC does not match")
        events.append(decode_event(body))
        at += 16 + length
    return events


# ---------------------------------------------------------------------------
# Runs to event files
# ---------------------------------------------------------------------------
def _scalars(record: dict) -> dict:
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and runs.is_finite_number(value) and not isinstance(value, bool)
    }


def write_run_events(run_dir: Path, out_dir: Path) -> tuple[Path, int]:
    """The run's metrics.jsonl as one event file in out_dir (made if need be; an earlier export of
    ours in it replaced): (its path, the number of steps written). RunError for a damaged run file."""
    records = runs.read_metrics(run_dir)
    try:
        started = (Path(run_dir) / "config.yaml").stat().st_mtime
    except OSError:
        started = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"events.out.tfevents.*{SUFFIX}"):
        old.unlink()
    path = out_dir / f"events.out.tfevents.{int(started)}.{socket.gethostname()}{SUFFIX}"
    temporary = out_dir / f".{path.name}.{os.getpid()}.tmp"
    with open(temporary, "wb") as out:
        out.write(frame(encode_event(started, file_version=FILE_VERSION)))
        for record in records:
            offset = record.get("wall_time")
            wall = started + (offset if runs.is_finite_number(offset) and math.isfinite(offset) else 0.0)
            out.write(frame(encode_event(wall, int(record["step"]), _scalars(record))))
    os.replace(temporary, path)
    return path, len(records)


@dataclass(frozen=True)
class Exported:
    written: list  # (run directory, event file, steps)
    skipped: list  # grouping.Skipped


def export_runs(paths, out_dir: Path) -> Exported:
    """Every run at or below the PATHs (as `attn compare` finds them) into out_dir/<its name>: its path
    below the PATH it was found under (a PATH that is a run: its own name). RunError when no run is found."""
    run_dirs, skipped = grouping.find_run_dirs(paths)
    wanted = {d.resolve() for d in run_dirs}
    named, seen = [], set()
    for path in grouping.expand_paths(paths):
        for run_dir in grouping.walk_runs(path):
            real = run_dir.resolve()
            if real in wanted and real not in seen:
                seen.add(real)
                below = run_dir.relative_to(path)
                named.append((run_dir, Path(real.name) if below == Path(".") else below))
    written = []
    for run_dir, name in named:
        try:
            path, steps = write_run_events(run_dir, Path(out_dir) / name)
        except runs.RunError as err:
            skipped.append(grouping.Skipped(run_dir, " ".join(str(err).removeprefix(f"{run_dir}/").split())))
            continue
        written.append((run_dir, path, steps))
    return Exported(written, skipped)
