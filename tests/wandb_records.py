"""Read a ``.wandb`` file back: wandb 0.31 ships no reader (``wandb.sdk.internal.datastore`` is
gone).

The file is a LevelDB-style log written by wandb-core: a 7-byte header (``:W&B``, magic 0xBEE1 as
u16, version u8), then 32 KiB blocks of chunks, each ``<crc32 u32><length u16><type u8>`` and data
(the CRC-32 covers the type byte and the data);
type 1 is a whole record, 2/3/4 the first/middle/last part of one split across blocks; a block tail
shorter than a chunk header is padding. Each record is a ``wandb_internal_pb2.Record``.

    run = read_run(folder)   # folder: wandb/offline-run-*/
    run.history, run.summary, run.config, run.exit_code
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
FILE_HEADER = struct.Struct("<4sHB")
CHUNK_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    data = Path(path).read_bytes()
    ident, magic, _ = FILE_HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a .wandb file"
    pos, parts = FILE_HEADER.size, []
    while pos + CHUNK_HEADER.size <= len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK_HEADER.size:
            pos += room
            continue
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0:  # zeros to the end of the block
            pos += room
            continue
        body = data[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length]
        pos += CHUNK_HEADER.size + length
        assert zlib.crc32(bytes([kind]) + body) == crc, f"{path}: bad checksum at byte {pos}"
        parts.append(body)
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def _update(target: dict, items) -> dict:
    """Apply history/summary/config items; a nested key (table-file fields) makes nested dicts."""
    for item in items:
        path = list(item.nested_key) or [item.key]
        node = target
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = json.loads(item.value_json)
    return target


@dataclass
class WandbRun:
    run: wandb_internal_pb2.RunRecord | None = None
    history: list[dict] = field(
        default_factory=list
    )  # one dict per history row, without _runtime etc.
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    exit_code: int | None = None
    metrics: list = field(default_factory=list)  # define_metric records (MetricRecord)


def read_run(folder: Path) -> WandbRun:
    (path,) = Path(folder).glob("run-*.wandb")
    out = WandbRun()
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.run = record.run
            _update(out.config, record.run.config.update)
        elif kind == "config":
            _update(out.config, record.config.update)
        elif kind == "history":
            row = _update({}, record.history.item)
            out.history.append(
                {k: v for k, v in row.items() if k not in ("_runtime", "_timestamp")}
            )
        elif kind == "summary":
            _update(out.summary, record.summary.update)
        elif kind == "metric":
            out.metrics.append(record.metric)
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    return out
