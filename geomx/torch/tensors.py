"""Torch tensors as the kvstore's numpy values, on the host or staged from a device.

A CPU parameter is its own host buffer: ``p.data.numpy()`` shares its memory, so a pull
writes straight into the model and a push reads the gradient without a copy
(examples/cnn_torch.py does the same by hand). A parameter on a GPU gets one staging
buffer per parameter for its weights and one for its gradient, allocated once, in
pinned memory when CUDA is there, so that every copy is a ``non_blocking`` DMA: all
gradients of a step go down together and one stream synchronisation covers them, and
pulled weights go up the same way -- never a ``.cpu()`` round trip per key
(docs/torch.md, "CUDA tensors"). The same code runs for a CPU tensor when staging is
forced (``stage_through_host=True``), which is how the tests exercise it without a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from geomx.torch.session import TorchAPIError

#: devices whose tensors the kvstore can carry (through a host buffer for ``cuda``)
DEVICES = ("cpu", "cuda")


def check_tensor(name: str, t: torch.Tensor, node: str) -> None:
    """Refuse, naming parameter and node, a tensor the kvstore and codecs cannot carry."""
    if t.device.type not in DEVICES:
        raise TorchAPIError(f"parameter {name!r} on node {node} is on device "
                            f"{str(t.device)!r}; geomx.torch carries tensors on: "
                            f"{', '.join(DEVICES)}")
    if t.dtype in (torch.bfloat16, torch.complex32) or t.is_sparse:
        kind = "sparse" if t.is_sparse else str(t.dtype)
        raise TorchAPIError(f"parameter {name!r} on node {node} is {kind}; geomx.torch "
                            "carries dense tensors of a numpy dtype (float32, float16, "
                            "float64, integers); convert it or keep it out of "
                            "named_parameters")


def _pinned() -> bool:
    return torch.cuda.is_available()


class HostBuffers:
    """The host arrays the kvstore reads and writes for a list of tensors."""

    def __init__(self, tensors: list[torch.Tensor], *, stage: bool = False,
                 with_grads: bool = True):
        self.tensors = tensors
        self.staged = [stage or t.device.type != "cpu" or not t.is_contiguous()
                       for t in tensors]
        self._host: list[torch.Tensor] = []
        self._grad_host: list[torch.Tensor | None] = []
        for t, staged in zip(tensors, self.staged):
            if staged:
                self._host.append(torch.empty(t.shape, dtype=t.dtype, pin_memory=_pinned()))
                self._grad_host.append(torch.empty(t.shape, dtype=t.dtype,
                                                   pin_memory=_pinned()) if with_grads else None)
            else:
                self._host.append(t.data)
                self._grad_host.append(None)
        self.weights = [h.numpy() for h in self._host]
        self._zero_grads: dict[int, np.ndarray] = {}
        self._device_busy = False

    # ---------------------------------------------------------------- weights
    def weights_from_device(self) -> list[np.ndarray]:
        """The current weights in the host arrays (one synchronisation for all)."""
        self._settle()
        copied = False
        for t, h, staged in zip(self.tensors, self._host, self.staged):
            if staged:
                h.copy_(t.data, non_blocking=True)
                copied = True
        if copied:
            _synchronize(self.tensors)
        return self.weights

    def weights_to_device(self) -> None:
        """Send pulled host weights to the tensors (asynchronous copies; the next write
        into a host buffer waits for them, :meth:`_settle`)."""
        for t, h, staged in zip(self.tensors, self._host, self.staged):
            if staged:
                t.data.copy_(h, non_blocking=True)
                self._device_busy = True

    def writable_weights(self) -> list[np.ndarray]:
        """The host arrays a pull may write into now."""
        self._settle()
        return self.weights

    # ---------------------------------------------------------------- gradients
    def grads_from_device(self, grads: list[torch.Tensor | None]) -> list[np.ndarray]:
        """The gradients as host arrays; a missing gradient (an unused parameter) is
        zeros, so every worker pushes every key of every round."""
        self._settle()
        out: list[np.ndarray] = []
        copied = False
        for i, (t, g, staged) in enumerate(zip(self.tensors, grads, self.staged)):
            if g is None:
                z = self._zero_grads.get(i)
                if z is None:
                    z = self._zero_grads[i] = np.zeros(tuple(t.shape),
                                                       dtype=self.weights[i].dtype)
                out.append(z)
            elif staged:
                gh = self._grad_host[i]
                assert gh is not None
                gh.copy_(g, non_blocking=True)
                copied = True
                out.append(gh.numpy())
            else:
                out.append(g.detach().numpy())
        if copied:
            _synchronize(self.tensors)
        return out

    def _settle(self) -> None:
        # copies to the device read the host buffers until they are done
        if self._device_busy:
            _synchronize(self.tensors)
            self._device_busy = False


def _synchronize(tensors: list[torch.Tensor]) -> None:
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    for d in devices:
        torch.cuda.synchronize(d)


def host_copy(t: torch.Tensor) -> np.ndarray:
    """A host array with ``t``'s value (a view for a contiguous CPU tensor)."""
    if t.device.type == "cpu" and t.is_contiguous():
        return t.detach().numpy()
    return t.detach().to("cpu").contiguous().numpy()


def to_tensor(t: torch.Tensor, value: Any) -> None:
    """Write a host value into ``t`` (wherever it lives)."""
    arr = np.ascontiguousarray(value)
    if not arr.flags.writeable:
        arr = arr.copy()
    src = torch.from_numpy(arr).reshape(t.shape)
    with torch.no_grad():
        t.copy_(src, non_blocking=t.device.type == "cuda")
