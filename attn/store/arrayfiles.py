"""A run directory's array files: .npz of plain arrays, written atomically, read bounded and without pickle.

    checkpoint.npz   param/<name>, optim/<key> and meta (JSON text): save_checkpoint_arrays, load_checkpoint
    attention.npz, mechanism.npz   plain arrays: save_arrays, load_arrays

Every file is written through runs.write_atomic (a temporary file, fsynced,
renamed) and read through runs.read_run_file (a regular file, not a link,
under a size cap); anything that is not a complete .npz of plain arrays of
the expected names, shapes and dtypes is refused with one line (RunError).
An array is sized from its .npy header (shape times item size) before a byte
of it is read: a header that declares more than the file's cap, or other than
the bytes that follow it, is refused, as numpy would allocate what it declares.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path

import numpy as np

from attn.config.yamlio import indefinite_article
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
    object array, is larger than `limit` bytes on disk or unpacked, or holds an
    array whose header declares more than `limit` bytes or other than it holds."""
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
        for info in npz.zip.infolist():  # each array sized by its header before any is read
            _check_header(npz.zip, info, path, limit, what)
        return {key: _read_array(npz, key, path) for key in npz.files}


def _key_of(info: zipfile.ZipInfo) -> str:
    """The name np.load gives a member of an .npz: its file name without `.npy`."""
    return info.filename.removesuffix(".npy")


NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _check_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, limit: int, what: str) -> None:
    """An .npz member's .npy header read alone, and the array it declares sized (shape times item size):
    RunError for a member that is no such array, an array of objects (only pickle loads it), one larger
    than `limit` bytes, or a header that declares other than the bytes that follow it (numpy would
    allocate what it declares before reading them)."""
    key = _key_of(info)
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version not in NPY_HEADERS:
                raise ValueError(f".npy format version {version[0]}.{version[1]}")
            shape, _, dtype = NPY_HEADERS[version](member)
            header = member.tell()
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as err:
        raise runs.RunError(f"{path}: refused: array {key!r} is damaged (its .npy header: {err})") from None
    if dtype.hasobject:
        raise runs.RunError(f"{path}: refused: array {key!r} holds objects that need pickle to load")
    if any(n < 0 for n in shape):
        raise runs.RunError(f"{path}: refused: array {key!r} is damaged (its header declares shape {list(shape)})")
    nbytes, held = math.prod(shape) * dtype.itemsize, info.file_size - header
    declares = f"its header declares {dtype}{list(shape)}, {nbytes} bytes"
    if nbytes > limit:
        raise runs.RunError(
            f"{path}: refused: array {key!r}: {declares}, more than {indefinite_article(what)} {what} holds "
            f"(limit {limit})"
        )
    if nbytes != held:
        raise runs.RunError(f"{path}: refused: array {key!r} is damaged: {declares}, but {held} follow it")


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
    """One array of the .npz, its header already checked (_check_header)."""
    try:
        return npz[key]
    except (ValueError, zipfile.BadZipFile, EOFError, OSError) as err:
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
