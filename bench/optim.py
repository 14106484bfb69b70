"""Optimizer kernel benchmark: one update of N float32 parameters, Numba kernel vs numpy.

    python bench/optim.py                    # 25M parameters (a ResNet-50), best of 3
    python bench/optim.py --n 1e6 --repeat 5 --only adam rmsprop

Each row times ``optimizer.update(key, weight, grad, state)`` -- what a global server
calls per key and round -- once through the Numba kernel (``use_kernels = True``) and
once through the numpy path of the same optimizer, in the same run, their repetitions
interleaved (the host is shared, so load comes and goes), best of ``--repeat`` after
one warm-up that also compiles the kernel (or loads it from numba's cache). The two
paths run on separate weight/state copies; the state values drift over repetitions,
which does not change the work done. Printed: ms per update, the ratio numpy/kernel,
and GB/s of float32 parameters updated (4 * N bytes per update). The load average is
printed too: other processes share this machine's cores.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from geomx.optim import OPTIMIZER_NAMES, create_optimizer
from geomx.optim import kernels as optim_kernels

#: Options that make every branch of an update run (weight decay, clipping).
OPTIONS = {"wd": 1e-4, "clip_gradient": 10.0, "rescale_grad": 0.25}


def _setup(name: str, n: int, use_kernels: bool, rng: np.random.Generator):
    opt = create_optimizer(name, **OPTIONS)
    opt.use_kernels = use_kernels
    w = rng.normal(size=n).astype(np.float32)
    return opt, w, opt.create_state(0, w)


def bench(name: str, n: int, repeat: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    grad = rng.normal(size=n).astype(np.float32)
    runs = [_setup(name, n, use, rng) for use in (True, False)]
    best = [float("inf"), float("inf")]
    for rep in range(repeat + 1):
        for i, (opt, w, state) in enumerate(runs):
            t0 = time.perf_counter()
            opt.update(0, w, grad, state, sender="a")
            elapsed = time.perf_counter() - t0
            if rep > 0:  # repetition 0 is the warm-up
                best[i] = min(best[i], elapsed)
    return best[0], best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=float, default=25e6, help="parameters (default 25M)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="optimizer names (default all elementwise ones)")
    args = parser.parse_args()
    n = int(args.n)
    names = args.only or [name for name in OPTIMIZER_NAMES if not name.startswith("dcasgd")]
    load = os.getloadavg()
    print(f"# {n:,} float32 parameters, best of {args.repeat}; threads {optim_kernels._threads()}, "
          f"chunk {optim_kernels.CHUNK:,}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'optimizer':<18} {'kernel ms':>10} {'numpy ms':>10} {'numpy/kernel':>13} {'kernel GB/s':>12}")
    for name in names:
        tk, tn = bench(name, n, args.repeat)
        print(f"{name:<18} {tk * 1e3:>10.1f} {tn * 1e3:>10.1f} {tn / tk:>12.2f}x {4 * n / tk / 1e9:>12.2f}",
              flush=True)
    load = os.getloadavg()
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
