"""A run directory's array files: .npz of plain arrays, written atomically, read bounded and without pickle.

    checkpoint.npz   param/<name>, optim/<key> and meta (JSON text): save_checkpoint_arrays, load_checkpoint
    attention.npz, mechanism.npz   plain arrays: save_arrays, load_arrays

Every file is written through runs.write_atomic (a temporary file, fsynced,
renamed) and read through runs.read_run_file (a regular file, not a link,
under a size cap); anything that is not a complete .npz of plain arrays of
the expected names, shapes and dtypes is refused with one line (RunError).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path

import numpy as np

from attn.store import runs

MAX_ARRAYS_BYTES = 256 << 20  # attention.npz (and any other array file but the checkpoint, whose cap is computed)
CHECKPOINT_SLACK_BYTES = 1 << 20  # a checkpoint's headers, metadata and zip directory beyond its arrays


def save_checkpoint_arrays(path: Path, params: dict, optim_state: dict, meta: dict) -> None:
    """params under 'param/<name>', optimiser state under 'optim/<key>', meta as JSON text."""
    arrays = {f"param/{k}": v for k, v in params.items()}
    arrays.update({f"optim/{k}": v for k, v in optim_state.items()})
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    save_arrays(path, arrays)


def save_arrays(path: Path, arrays: dict) -> None:
    """An .npz of plain arrays, written atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    runs.write_atomic(Path(path), buffer.getvalue())


def load_arrays(path: Path, limit: int = MAX_ARRAYS_BYTES, what: str = "array file") -> dict[str, np.ndarray]:
    """Every array of an .npz of plain arrays (no pickle), read into memory:
    runs.RunError for a missing file, one that is not a complete .npz, holds an
    object array or is larger than `limit` bytes on disk or unpacked."""
    path = Path(path)
    data = runs.read_run_file(path, limit, what)
    if data is None:
        raise runs.RunError(f"{path}: no {what}")
    try:
        npz = np.load(io.BytesIO(data), allow_pickle=False)
    except (EOFError, OSError, zipfile.BadZipFile) as err:
        raise runs.RunError(f"{path}: refused: not a complete .npz {what} ({err})") from None
    except ValueError:  # neither a zip nor an .npy: numpy would try pickle
        raise runs.RunError(f"{path}: refused: not an .npz {what}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise runs.RunError(f"{path}: refused: a single array, not an .npz {what}")
    with npz:
        unpacked = sum(info.file_size for info in npz.zip.infolist())
        if unpacked > limit:
            raise runs.RunError(f"{path}: refused: its arrays unpack to {unpacked} bytes (limit {limit})")
        return {key: _read_array(npz, key, path) for key in npz.files}


def checkpoint_limit(param_shapes: dict, optim_template: dict, dtype: str) -> int:
    """The largest checkpoint.npz a run of these sizes can write: its arrays plus slack."""
    params = sum(math.prod(shape) for shape in param_shapes.values()) * np.dtype(dtype).itemsize
    return params + sum(v.nbytes for v in optim_template.values()) + CHECKPOINT_SLACK_BYTES


def load_checkpoint(path: Path, param_shapes: dict, optim_template: dict, dtype: str):
    """(params, optim_state, meta) from a checkpoint, refusing anything that does
    not match the expected names, shapes and dtypes, needs pickle, or is larger
    than a checkpoint of these sizes can be (checkpoint_limit)."""
    path = Path(path)
    arrays = load_arrays(path, checkpoint_limit(param_shapes, optim_template, dtype), "checkpoint")
    if "meta" not in arrays:
        raise runs.RunError(f"{path}: refused: missing array 'meta'")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError:
        raise runs.RunError(f"{path}: refused: array 'meta' is not JSON") from None
    if not isinstance(meta, dict):
        raise runs.RunError(f"{path}: refused: array 'meta' is not a JSON object")
    params = _take(arrays, "param/", {k: (s, dtype) for k, s in param_shapes.items()}, path)
    optim_state = _take(arrays, "optim/", {k: (v.shape, v.dtype) for k, v in optim_template.items()}, path)
    return params, optim_state, meta


def _read_array(npz, key: str, path: Path) -> np.ndarray:
    try:
        return npz[key]
    except ValueError:  # an object array: only pickle could load it
        raise runs.RunError(f"{path}: refused: array {key!r} holds objects that need pickle to load") from None
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise runs.RunError(f"{path}: refused: array {key!r} is damaged ({err})") from None


def _take(arrays: dict, prefix: str, expected: dict, path: Path) -> dict:
    out = {}
    for name, (shape, dtype) in expected.items():
        key = prefix + name
        if key not in arrays:
            raise runs.RunError(f"{path}: refused: missing array {key!r}")
        value = arrays[key]
        if value.shape != tuple(shape) or value.dtype != np.dtype(dtype):
            raise runs.RunError(
                f"{path}: refused: {key!r} is {value.dtype}{list(value.shape)}, expected {np.dtype(dtype)}{list(shape)}"
            )
        out[name] = value
    return out
