"""The torch CPU side of ``bench/codecs.py``: each codec operation written the torch way.

Imports only numpy and torch (no geomx, no numba), so ``bench/codecs.py`` can run it in
its own process or, with ``--torch-python PATH``, under another Python that has torch::

    python bench/codecs_torch.py --n 25e6 --repeat 5 --threads 2 --k 250000

prints one JSON object: operation -> best seconds. The operations mirror the rows of
``bench/codecs.py`` on the same fp32 input (same seed): fp16 / bf16 casts both ways,
top-k sparsify (``torch.topk`` of |x| and the values at those indices: the selection
Bi-Sparse makes, without its momentum and sampling), scatter-add decode
(``index_add_``), decode into a new dense array, and one-bit sign compression with
error feedback (mean-magnitude scale, bits packed 8 to a byte with shifts, as torch has
no packbits) and its decode.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import numpy as np


def best_of(fn: Callable[[], object], repeat: int, setup: Callable[[], None] | None = None) -> float:
    if setup:
        setup()
    fn()
    best = float("inf")
    for _ in range(repeat):
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def torch_times(n: int, repeat: int, threads: int, k: int, seed: int) -> dict[str, Any]:
    """Best seconds per operation (and ``torch_version``); ``k`` is how many values the sparsifier keeps."""
    import torch

    torch.set_num_threads(max(1, threads))
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal(n, dtype=np.float32))
    out = torch.empty(n, dtype=torch.float32)
    t: dict[str, Any] = {"torch_version": torch.__version__}
    h16 = x.to(torch.float16)
    t["fp16 encode"] = best_of(lambda: x.to(torch.float16), repeat)
    t["fp16 decode"] = best_of(lambda: out.copy_(h16), repeat)
    hb = x.to(torch.bfloat16)
    t["bf16 encode"] = best_of(lambda: x.to(torch.bfloat16), repeat)
    t["bf16 decode"] = best_of(lambda: out.copy_(hb), repeat)
    del h16, hb

    def topk() -> tuple[object, object]:
        idx = torch.topk(x.abs(), k, sorted=False).indices
        return x[idx], idx

    t["top-k sparsify"] = best_of(topk, repeat)
    vals, idx = topk()
    acc = torch.zeros(n, dtype=torch.float32)
    t["scatter-add decode"] = best_of(lambda: acc.index_add_(0, idx, vals), repeat)

    def dense() -> object:
        o = torch.zeros(n, dtype=torch.float32)
        o[idx] = vals
        return o

    t["dense decode"] = best_of(dense, repeat)
    residual = torch.zeros(n, dtype=torch.float32)
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8)
    m = (n + 7) // 8 * 8

    def onebit() -> tuple[object, object]:
        r = residual.add_(x)
        scale = r.abs().mean()
        bits = r >= 0
        r.sub_(torch.where(bits, scale, -scale))
        padded = torch.zeros(m, dtype=torch.uint8)
        padded[:n] = bits
        packed = (padded.view(-1, 8) << shifts).sum(dim=1, dtype=torch.uint8)
        return packed, scale

    residual0 = torch.zeros(n, dtype=torch.float32)
    t["onebit encode"] = best_of(onebit, repeat, lambda: residual.copy_(residual0))
    packed, scale = onebit()

    def onebit_decode() -> object:
        bits = ((packed.unsqueeze(1) >> shifts) & 1).view(-1)[:n]
        torch.mul(bits.to(torch.float32).mul_(2).sub_(1), scale, out=out)
        return out

    t["onebit decode"] = best_of(onebit_decode, repeat)
    xn = x.numpy()
    on = out.numpy()
    t["memcpy"] = best_of(lambda: np.copyto(on, xn), repeat)
    return t


def main() -> None:
    p = argparse.ArgumentParser("codecs_torch")
    p.add_argument("--n", type=float, default=25e6)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(json.dumps(torch_times(int(a.n), a.repeat, a.threads, a.k, a.seed)))


if __name__ == "__main__":
    main()
