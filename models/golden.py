"""The golden pair's input, stored small and exact.

A golden input is the model's input batch for one preprocessed frame; the golden check compares the model's
outputs on exactly that batch, so what a device decodes must be bit for bit what the writer ran. Stored as
float32 it was the largest file of a package (4 x 3 x 800 x 608 floats: 23 MB beside a 7.5 MB model), sent
on every OTA push. It is stored instead as a compressed .npz (``golden_input.npz``) that decodes exactly:

    palette   a preprocessed frame holds at most 256 distinct values per channel ((x*scale - mean) / std
              of a uint8 pixel): uint8 `codes` plus each channel's `table` of values, table[c][codes]
    raw       the array itself (`values`), compressed: any channel with more than 256 distinct values, or
              an input that is already one byte per value

and either way the batch's rows once when they are all the same row (the writer's batch is one frame
tiled), with the batch size in `shape`. Values are told apart by their bits, so -0.0, +0.0 and every NaN
come back as they were written.

Old packages carry ``golden_input.npy`` (the plain array); `load_input` reads both, and every reader
(daemon/lifecycle/admission.py, cli/model_init.py) goes through it. `load_output` reads the outputs (an .npz, written
compressed since) whole and closes the file.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

FORMAT = 1  # the `edged_golden_input` entry: this encoding's version
INPUT_FILE = "golden_input.npz"
OUTPUT_FILE = "golden_output.npz"
_MAX_CODES = 256


def encode_input(x: np.ndarray, channel_axis: int | None) -> dict[str, np.ndarray]:
    """The .npz entries that `decode_input` turns back into `x`, bit for bit. `channel_axis`: the axis of
    `x` whose entries each get their own value table (1 for NCHW, 3 for NHWC); None: one table for all."""
    if x.ndim < 1 or x.shape[0] < 1:
        raise ValueError(f"a golden input needs a batch axis with rows, not shape {list(x.shape)}")
    if channel_axis is not None and not 1 <= channel_axis < x.ndim:
        raise ValueError(f"channel_axis {channel_axis} is not a row axis of shape {list(x.shape)}")
    rows = x[:1] if _same_rows(x) else x
    head = {
        "edged_golden_input": np.array(FORMAT),
        "shape": np.array(x.shape, np.int64),
        "dtype": np.array(x.dtype.str),
    }
    palette = None if x.dtype.itemsize == 1 else _palette(rows, channel_axis)
    if palette is None:
        return head | {"values": np.ascontiguousarray(rows)}
    codes, table = palette
    axis = -1 if channel_axis is None else channel_axis
    return head | {"codes": codes, "table": table, "axis": np.array(axis, np.int64)}


def decode_input(entries: dict[str, np.ndarray] | np.lib.npyio.NpzFile) -> np.ndarray:
    """The array `encode_input` encoded; ValueError naming what is wrong with entries it did not write."""
    try:
        if int(entries["edged_golden_input"]) != FORMAT:
            raise ValueError(f"golden input format {int(entries['edged_golden_input'])}, this edged reads {FORMAT}")
        shape = tuple(int(n) for n in entries["shape"])
        dtype = np.dtype(str(entries["dtype"]))
        if "values" in entries:
            rows = np.asarray(entries["values"])
            if rows.dtype != dtype:
                raise ValueError(f"golden input values are {rows.dtype}, its header says {dtype}")
        else:
            rows = _unpalette(np.asarray(entries["codes"]), np.asarray(entries["table"]), int(entries["axis"]))
            if rows.dtype != dtype:
                raise ValueError(f"golden input table is {rows.dtype}, its header says {dtype}")
    except KeyError as exc:
        raise ValueError(f"golden input: entry {exc} missing") from exc
    if rows.shape[1:] != shape[1:] or rows.shape[0] not in (1, shape[0]):
        raise ValueError(f"golden input rows are {list(rows.shape)}, its header says {list(shape)}")
    return np.ascontiguousarray(np.broadcast_to(rows, shape)) if rows.shape[0] != shape[0] else rows


def save_input(path: Path, x: np.ndarray, channel_axis: int | None) -> None:
    """Write `x` to `path` (an .npz) in the encoding above."""
    with open(path, "wb") as f:
        np.savez_compressed(f, **encode_input(x, channel_axis))  # type: ignore[arg-type]


def load_input(path: Path) -> np.ndarray:
    """A package's golden input: this encoding (.npz) or an old package's plain .npy. OSError when the file
    cannot be read, ValueError when it is not a golden input."""
    try:
        with open(path, "rb") as f:  # ours to close: np.load leaks the file of an .npz it cannot open
            loaded = np.load(f, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                return loaded  # golden_input.npy, written before the encoding
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise ValueError(f"{path.name}: not an array file")
            if "edged_golden_input" not in loaded.files:
                raise ValueError(f"{path.name}: an .npz without edged's golden-input header")
            return decode_input(loaded)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ValueError(f"{path.name}: damaged golden input ({exc})") from exc


def _same_rows(x: np.ndarray) -> bool:
    bits = _bits(x)
    return bool((bits == bits[:1]).all())


def _bits(x: np.ndarray) -> np.ndarray:
    """`x` as unsigned integers of its item size: equal bits, equal values (so -0.0 != 0.0, NaN == NaN)."""
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.itemsize in (1, 2, 4, 8) else x


def _palette(rows: np.ndarray, channel_axis: int | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes, table) with table[c][codes[..c..]] == rows, or None when a channel has more than 256 values."""
    if rows.dtype.itemsize not in (2, 4, 8):
        return None
    by_channel = rows[np.newaxis] if channel_axis is None else np.moveaxis(rows, channel_axis, 0)
    bits = np.ascontiguousarray(by_channel).view(np.dtype(f"u{rows.dtype.itemsize}"))
    codes = np.empty(bits.shape, np.uint8)
    tables = []
    for c in range(bits.shape[0]):
        values, inverse = np.unique(bits[c], return_inverse=True)
        if values.size > _MAX_CODES:
            return None
        codes[c] = inverse.reshape(bits[c].shape)
        tables.append(np.pad(values, (0, _MAX_CODES - values.size)))
    table = np.stack(tables).view(rows.dtype)
    codes = codes[0] if channel_axis is None else np.moveaxis(codes, 0, channel_axis)
    return np.ascontiguousarray(codes), table


def _unpalette(codes: np.ndarray, table: np.ndarray, axis: int) -> np.ndarray:
    if codes.dtype != np.uint8 or table.ndim != 2 or table.shape[1] != _MAX_CODES:
        raise ValueError(f"golden input palette is {codes.dtype} codes with a {list(table.shape)} table")
    if axis == -1:
        if table.shape[0] != 1:
            raise ValueError(f"golden input: one table expected, got {table.shape[0]}")
        flat: np.ndarray = table[0][codes]
        return flat
    if not 1 <= axis < codes.ndim or codes.shape[axis] != table.shape[0]:
        raise ValueError(f"golden input: {table.shape[0]} tables for axis {axis} of {list(codes.shape)}")
    out = np.empty(codes.shape, table.dtype)
    by_channel, code_by_channel = np.moveaxis(out, axis, 0), np.moveaxis(codes, axis, 0)
    for c in range(table.shape[0]):
        by_channel[c] = table[c][code_by_channel[c]]
    return out


def load_output(path: Path) -> dict[str, np.ndarray]:
    """A package's golden outputs (output name -> array), read whole and the file closed. OSError when it
    cannot be read, ValueError when it is not an .npz of arrays."""
    try:
        with open(path, "rb") as f:
            loaded = np.load(f, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise ValueError(f"{path.name}: not an .npz of outputs")
            return {name: loaded[name] for name in loaded.files}
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ValueError(f"{path.name}: damaged golden output ({exc})") from exc
