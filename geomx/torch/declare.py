"""Keys named after parameters, declared once on the servers, checked across workers.

Every name becomes a kvstore string key (``STRING_KEY_BASE + crc32(name)``,
geomx/node/kv_state.py). Before any of them is initialised, the node's list of
``(name, shape, dtype)`` is compared with the master worker's: the master worker
initialises a *signature* key and every worker pulls it. A worker whose list differs
fails naming its first differing parameter and itself, instead of initialising a key
the master worker never will (whose pulls would wait forever).

The signature is bytes carried as float32 values 0..255, exact through every codec
(fp16 and bf16 round only above 256; weights are never sparsified, link_codec.py):
row 0 holds the entry count, row ``1 + i`` a CRC of entry ``i`` (entries past the table
fold into it by XOR, so any difference still shows, if not where).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

import numpy as np

from geomx.torch.session import Session, TorchAPIError
from geomx.torch.waits import Operation

SIGNATURE_ROWS = 256
Entry = tuple[str, tuple[int, ...], str]


def as_bytes_array(data: bytes) -> np.ndarray:
    """Bytes as float32 values 0..255 (exact through fp16/bf16)."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.float32)


def from_bytes_array(values: np.ndarray) -> bytes:
    return np.rint(values).astype(np.uint8).tobytes()


def signature(entries: list[Entry]) -> np.ndarray:
    table = np.zeros((SIGNATURE_ROWS, 4), dtype=np.uint8)
    table[0] = np.frombuffer(struct.pack("<I", len(entries)), dtype=np.uint8)
    for i, entry in enumerate(entries):
        row = 1 + i % (SIGNATURE_ROWS - 1)
        table[row] ^= np.frombuffer(struct.pack("<I", _crc(entry)), dtype=np.uint8)
    return table.astype(np.float32)


def _crc(entry: Entry) -> int:
    name, shape, dtype = entry
    return zlib.crc32(f"{name}|{list(shape)}|{dtype}".encode())


def mismatch(mine: list[Entry], master: np.ndarray, node: str) -> str | None:
    """What differs between this node's entries and the master worker's signature."""
    ours = signature(mine)
    if np.array_equal(ours, np.rint(master)):
        return None
    theirs_count = struct.unpack("<I", np.rint(master[0]).astype(np.uint8).tobytes())[0]
    for i in range(min(len(mine), SIGNATURE_ROWS - 1)):
        if not np.array_equal(ours[1 + i], np.rint(master[1 + i])):
            name, shape, dtype = mine[i]
            return (f"named_parameters disagree between workers: node {node}'s parameter "
                    f"{i} {name!r} (shape {list(shape)}, {dtype}) is not the master "
                    f"worker's parameter {i}; every worker must pass the same names, "
                    "shapes and dtypes in the same order")
    if len(mine) != theirs_count:
        extra = (f"; its first extra parameter is {mine[theirs_count][0]!r}"
                 if len(mine) > theirs_count else "")
        return (f"named_parameters disagree between workers: node {node} has {len(mine)} "
                f"entries, the master worker {theirs_count}{extra}")
    return (f"named_parameters disagree between workers: node {node}'s list differs from "
            "the master worker's past its first "
            f"{SIGNATURE_ROWS - 1} entries")


def declare(s: Session, entries: list[Entry], values: list[np.ndarray],
            outs: list[np.ndarray] | None, what: str) -> Operation[None]:
    """Initialise ``entries`` (names, shapes, dtypes) with ``values`` after checking them
    against the master worker's, and pull the master worker's values into ``outs``
    (workers only). Names already declared by this node are refused."""
    kv = s.kv
    again = [e[0] for e in entries if e[0] in s.declared]
    if again:
        raise TorchAPIError(f"{what}: {again[0]!r} is already initialised on node "
                            f"{s.node_name}; broadcast each parameter once, before training")
    key = s.next_signature_key()
    sig = signature(entries)
    kv.init(key, sig)
    if not s.is_master:
        master = np.empty_like(sig)
        yield [kv.pull(key, out=master)]
        problem = mismatch(entries, master, s.node_name)
        if problem is not None:
            raise TorchAPIError(problem)
    names = [e[0] for e in entries]
    if names:
        waits = [kv.init(names, values)]
        if outs is not None and not s.is_master:
            waits += [kv.pull(n, out=o, priority=-i) for i, (n, o) in enumerate(zip(names, outs))]
        yield waits
    for name, shape, dtype in entries:
        s.declared[name] = (shape, dtype)


def entries_of(named: Iterable[tuple[str, object]]) -> list[Entry]:
    out = []
    for name, t in named:
        out.append((str(name), tuple(int(d) for d in t.shape),  # type: ignore[attr-defined]
                    str(t.dtype).replace("torch.", "")))       # type: ignore[attr-defined]
    return out
