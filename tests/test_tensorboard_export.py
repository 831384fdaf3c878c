"""attn export --tensorboard: TFRecord framing and a hand-encoded Event protobuf, read back by our reader
(held by test vectors) and, where the tensorboard package is installed, by TensorBoard's own."""

import json
import math
import struct

import pytest
from board_runs import write_run

from attn import cli
from attn.report import tensorboard
from attn.store import runs


def test_crc32c_and_its_mask_match_the_published_vectors():
    assert tensorboard.crc32c(b"123456789") == 0xE3069283  # RFC 3720 B.4's check value
    assert tensorboard.crc32c(b"\x00" * 32) == 0x8A9136AA
    assert tensorboard.crc32c(b"\xff" * 32) == 0x62A8AB43
    crc = 0xE3069283
    assert tensorboard.masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_an_event_is_the_protobuf_bytes_tensorboard_expects():
    data = tensorboard.encode_event(1.5, 7, {"loss": 0.25})
    value = b"\x0a\x04loss" + b"\x15" + struct.pack("<f", 0.25)  # Value: tag (1), simple_value (2, fixed32)
    summary = b"\x0a" + bytes([len(value)]) + value  # Summary: value (1)
    assert data == b"\x09" + struct.pack("<d", 1.5) + b"\x10\x07" + b"\x2a" + bytes([len(summary)]) + summary
    framed = tensorboard.frame(data)
    assert framed[:8] == struct.pack("<Q", len(data)) and framed[12:-4] == data
    assert tensorboard.decode_event(data) == tensorboard.Event(1.5, 7, None, {"loss": 0.25})


def test_export_writes_every_runs_logged_scalars_and_reads_back(tmp_path, capsys):
    for seed in (0, 1):
        write_run(tmp_path / "runs" / "exp" / f"s{seed}", f"seed={seed}", steps=100)
    run = tmp_path / "runs" / "exp" / "s1"
    with open(run / "metrics.jsonl", "a") as out:  # a diverged step: its non-finite loss is left out
        out.write(json.dumps({"step": 110, "eval_loss": None, "train_loss": 1e22}) + "\n")
    out = tmp_path / "tb"
    assert cli.main(["export", str(tmp_path / "runs"), "--tensorboard", str(out)]) == 0
    files = sorted(out.rglob("events.out.tfevents.*"))
    assert [f.parent.relative_to(out).as_posix() for f in files] == ["exp/s0", "exp/s1"]
    events = tensorboard.read_events(files[1])
    assert events[0].file_version == tensorboard.FILE_VERSION
    records = runs.read_metrics(run)
    assert [e.step for e in events[1:]] == [r["step"] for r in records]
    for event, record in zip(events[1:], records):
        expected = {k: v for k, v in record.items() if k != "step" and v is not None}
        assert event.scalars.keys() == expected.keys()
        assert all(math.isclose(event.scalars[k], v, rel_tol=1e-6) for k, v in expected.items())
    # again: the earlier export is replaced, not doubled
    assert cli.main(["export", str(tmp_path / "runs"), "--tensorboard", str(out)]) == 0
    assert sorted(out.rglob("events.out.tfevents.*"))[0].parent == files[0].parent
    assert len(list(out.rglob("events.out.tfevents.*"))) == 2
    assert "tensorboard --logdir" in capsys.readouterr().err


def test_a_damaged_event_file_is_refused_with_its_offset(tmp_path):
    write_run(tmp_path / "r", steps=30)
    path, _ = tensorboard.write_run_events(tmp_path / "r", tmp_path / "tb")
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(tensorboard.EventFileError, match="offset 0: the data's CRC"):
        tensorboard.read_events(path)


def test_tensorboards_own_reader_reads_the_export(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (optional)")
    from tensorboard.backend.event_processing import event_accumulator

    write_run(tmp_path / "r", steps=50)
    path, steps = tensorboard.write_run_events(tmp_path / "r", tmp_path / "tb")
    accumulator = event_accumulator.EventAccumulator(str(path.parent))
    accumulator.Reload()
    losses = accumulator.Scalars("eval_loss")
    records = runs.read_metrics(tmp_path / "r")
    assert [s.step for s in losses] == [r["step"] for r in records]
    assert all(math.isclose(s.value, r["eval_loss"], rel_tol=1e-6) for s, r in zip(losses, records))
