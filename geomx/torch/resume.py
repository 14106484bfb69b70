"""What a ``geomx.torch`` worker keeps in its checkpoints, and gives back on ``--resume``.

Under BytePS's semantics (geomx/torch/exchange.py) the servers sum gradients and every
worker's wrapped torch optimizer steps its own copy of the model: the weights, the
buffers ``broadcast_parameters`` was given (BatchNorm's running statistics) and the
optimizer's per-parameter state (momentum, Adam's moments and step) live on the worker,
not on the servers, whose keys hold the last round's gradient sum. A checkpoint must
therefore carry them in the worker's part, which is what the program's ``ctx.state`` is
for (geomx/node/program.py; docs/reliability.md, "Training programs").

:func:`publish` puts them there after every ``step()`` of a job that takes checkpoints:
views of CPU tensors (no copy; their values are read when the checkpoint is written, at
the start of the next iteration), and host copies of tensors on another device, made
only when the round just finished is a checkpoint round. On resume, :func:`restore_tensors` writes the saved values
back over what ``broadcast_parameters`` pulled, and :func:`restore_optimizer` refills the
wrapped optimizer's state before the first ``step()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from geomx.torch.session import Session, TorchAPIError
from geomx.torch.tensors import host_copy, to_tensor

#: the entry of ``ctx.state`` this module owns
STATE_KEY = "geomx.torch"


def _view(t: torch.Tensor, copy_others: bool) -> np.ndarray | None:
    if t.device.type == "cpu" and t.is_contiguous():
        return t.detach().numpy()
    return host_copy(t) if copy_others else None


def publish(s: Session, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> None:
    """Refresh this worker's entry of ``ctx.state``: the tensors broadcast so far and the
    state of ``optimizer``, whose parameters are named by ``names`` (``id(p)`` -> name).
    Nothing in a job that takes no checkpoints."""
    if s.is_master or not s.ctx.checkpointing:
        return
    due = bool(s.node.state.ckpt_due)
    entry: dict[str, Any] = s.ctx.state.setdefault(STATE_KEY, {})
    tensors = entry.setdefault("tensors", {})
    for name, t in s.tracked.items():
        value = _view(t, due)
        if value is not None:
            tensors[name] = value
    params: dict[str, Any] = {}
    for p, state in optimizer.state.items():
        name = names.get(id(p))
        if name is None:
            continue
        saved = {}
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                value = _view(v, due)
                if value is not None:
                    saved[k] = {"tensor": value, "dtype": str(v.dtype),
                                "shape": list(v.shape), "on_cpu": v.device.type == "cpu"}
            elif isinstance(v, (bool, int, float)):
                saved[k] = v
        params[name] = saved
    entry["optimizer"] = params
    entry["groups"] = [{k: v for k, v in g.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)}
                       for g in optimizer.param_groups]


def _saved(s: Session) -> dict[str, Any] | None:
    if s.is_master or not s.ctx.resumed:
        return None
    return s.ctx.state.get(STATE_KEY)


def restore_tensors(s: Session, named: Iterable[tuple[str, torch.Tensor]]) -> None:
    """On resume, write the checkpoint's values of ``named`` into them (a tensor the
    checkpoint lacks is an error naming it: the program broadcasts another model)."""
    saved = _saved(s)
    if saved is None:
        return
    values = saved.get("tensors", {})
    for name, t in named:
        if name not in values:
            raise TorchAPIError(f"resuming on node {s.node_name}: the checkpoint holds no "
                                f"value of {name!r}; the program must broadcast the same "
                                "tensors as the run that wrote it")
        value = np.asarray(values[name])  # (a 0-d tensor comes back with one element)
        if value.size != t.numel():
            raise TorchAPIError(f"resuming on node {s.node_name}: {name!r} has "
                                f"{t.numel()} elements, the checkpoint's value {value.size}")
        to_tensor(t, value)


def restore_optimizer(s: Session, optimizer: torch.optim.Optimizer,
                      params: dict[str, torch.Tensor]) -> None:
    """On resume, refill ``optimizer``'s per-parameter state and its groups' numeric
    hyper-parameters from the checkpoint (``params``: name -> parameter)."""
    saved = _saved(s)
    if saved is None or "optimizer" not in saved:
        return
    for name, state in saved["optimizer"].items():
        p = params.get(name)
        if p is None:
            raise TorchAPIError(f"resuming on node {s.node_name}: the checkpoint holds "
                                f"optimizer state of {name!r}, which this optimizer lacks")
        restored: dict[str, Any] = {}
        for k, v in state.items():
            if isinstance(v, dict) and "tensor" in v:
                dtype = getattr(torch, str(v["dtype"]).removeprefix("torch."))
                value = torch.from_numpy(np.array(v["tensor"])).to(dtype).reshape(
                    [int(n) for n in v["shape"]])
                # where torch kept it: Adam's step is a CPU scalar unless capturable
                restored[k] = value if v.get("on_cpu") else value.to(p.device)
            else:
                restored[k] = v
        optimizer.state[p] = restored
    for group, values in zip(optimizer.param_groups, saved.get("groups", [])):
        for k, v in values.items():
            if k in group:
                group[k] = type(group[k])(v)
