"""``broadcast_parameters`` and ``broadcast_optimizer_state`` (Horovod's names).

geomx publishes the initial model from the master worker (docs/geomx-behaviour.md §3.1):
it initialises every key, a global server publishes a key at the master's INIT only (a
local server takes the global value; a flat-PS worker's own INIT is acknowledged and
unused), and every worker pulls it.
Broadcasting is that: each name becomes a key (geomx/torch/declare.py), the master
worker's value is the one every worker ends up with. ``root_rank`` is therefore 0, the
master worker; any other rank is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from geomx.torch.declare import as_bytes_array, declare, entries_of, from_bytes_array
from geomx.torch.resume import restore_tensors
from geomx.torch.session import Session, TorchAPIError, session
from geomx.torch.tensors import check_tensor, host_copy, to_tensor
from geomx.torch.waits import Operation, drive


def _named(params: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[tuple[str, torch.Tensor]]:
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    out = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TorchAPIError("broadcast_parameters takes model.state_dict() or "
                                f"model.named_parameters(); got an item {item!r:.60}")
        out.append(item)
    return out


def _root(root_rank: int) -> None:
    if root_rank != 0:
        raise TorchAPIError(f"root_rank={root_rank}: geomx publishes the initial model from "
                            "the master worker; allowed: root_rank=0")


def _tensors_op(s: Session, named: list[tuple[str, torch.Tensor]], what: str) -> Operation[None]:
    for name, t in named:
        check_tensor(name, t, s.node_name)
    hosts = [host_copy(t) for _, t in named]
    # an integer tensor (BatchNorm's num_batches_tracked) travels as its bytes: the
    # codecs encode float tensors only, and the bytes survive every codec exactly
    carried = [h if t.is_floating_point() else as_bytes_array(np.ascontiguousarray(h).tobytes())
               for (_, t), h in zip(named, hosts)]
    yield from declare(s, entries_of(named), carried, carried, what)
    if not s.is_master:
        for (_, t), h, c in zip(named, hosts, carried):
            if c is not h:
                to_tensor(t, np.frombuffer(from_bytes_array(c), dtype=h.dtype).reshape(h.shape))
            elif t.device.type != "cpu" or not t.is_contiguous():
                to_tensor(t, h)


def _parameters_op(s: Session, named: list[tuple[str, torch.Tensor]]) -> Operation[None]:
    yield from _tensors_op(s, named, "broadcast_parameters")
    for name, t in named:
        s.tracked[name] = t
    restore_tensors(s, named)  # resuming: the worker's own model, not the servers' sums


def broadcast_parameters(params: Mapping[str, Any] | Iterable[tuple[str, Any]],
                         root_rank: int = 0) -> Any:
    """Give every worker the master worker's values of ``params`` (``model.state_dict()``
    or ``model.named_parameters()``), in place. Blocks in a synchronous program; in an
    ``async def main`` returns an awaitable: ``await broadcast_parameters(...)``.

    Call it once, before training, on every node, the master worker included: this is
    where the parameters' keys are created and where the workers' names, shapes and
    dtypes are checked against the master worker's. A worker's checkpoints carry these
    tensors, and a resumed run gets them back here (geomx/torch/resume.py)."""
    _root(root_rank)
    s = session()
    return drive(s, _parameters_op(s, _named(params)))


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              named_parameters: Iterable[tuple[str, Any]] | None = None) -> Any:
    """Give every worker the master worker's optimizer state: each parameter group's
    numeric hyper-parameters (``lr``, ``momentum``...) and every tensor of the per-parameter
    state (momentum buffers, Adam's moments and step), named after the parameter
    (``named_parameters``; else ``group<i>.param<j>``). Every node must hold the same
    state structure (an optimizer that has not stepped yet has none: then only the
    hyper-parameters travel). Blocks, or returns an awaitable, as :func:`broadcast_parameters`."""
    _root(root_rank)
    s = session()
    inner = getattr(optimizer, "optimizer", optimizer)
    names = {}
    if named_parameters is not None:
        names = {id(p): n for n, p in named_parameters}
    named: list[tuple[str, torch.Tensor]] = []
    scalars: list[tuple[dict[str, Any], str]] = []
    for gi, group in enumerate(inner.param_groups):
        for hk in sorted(group):
            v = group[hk]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                scalars.append((group, hk))
        for pj, p in enumerate(group["params"]):
            base = names.get(id(p), f"group{gi}.param{pj}")
            for sk, sv in sorted(inner.state.get(p, {}).items()):
                if isinstance(sv, torch.Tensor):
                    named.append((f"optimizer/{base}/{sk}", sv))
    packed = np.frombuffer(b"".join(struct.pack("<d", float(g[k])) for g, k in scalars),
                           dtype=np.uint8)
    hyper = torch.from_numpy(as_bytes_array(packed.tobytes()).copy())
    return drive(s, _optimizer_op(s, named, hyper, scalars))


def _optimizer_op(s: Session, named: list[tuple[str, torch.Tensor]], hyper: torch.Tensor,
                  scalars: list[tuple[dict[str, Any], str]]) -> Operation[None]:
    key = f"optimizer/hyper-parameters/{s.broadcasts + 1}"
    yield from _tensors_op(s, [(key, hyper), *named], "broadcast_optimizer_state")
    raw = from_bytes_array(hyper.numpy())
    for i, (group, hk) in enumerate(scalars):
        (v,) = struct.unpack("<d", raw[8 * i:8 * i + 8])
        group[hk] = type(group[hk])(v)
