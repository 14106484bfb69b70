"""Codec kernel benchmark: Numba kernels vs plain numpy, GB/s of fp32 input.

    python bench/codecs.py                 # 25M fp32 (a ResNet-50 gradient), best of 5
    python bench/codecs.py --n 1e6 --repeat 3
    python bench/codecs.py --cuda          # also the numba.cuda kernels, if a GPU is present
    python bench/codecs.py --launch --busy 2   # per-call time of small and large calls, with
                                               # 2 busy-loop processes loading the cores

Every row times the codec API call (what a node calls) against the numpy reference of
the same algorithm (``geomx.codec.reference``) in the same run: best of ``--repeat``
after one warm-up, kernel and numpy repetitions interleaved (the host is shared, so
load changes during a run), with any mutated state restored before each repetition
(outside the timed region). Throughput is bytes of fp32 *input* (4 * N) per second, whatever
the operation reads or writes, so rows compare with each other and with link speeds
(1 Gbps = 0.125 GB/s). The target column is each row's goal on a 2-core machine.

Two more columns put each row against ceilings measured in the same run: "of copy" is
``np.copyto`` of the same 25M array over the kernel's time (the machine's memory copy
speed), and "x torch" is torch CPU's time for the same operation
(``bench/codecs_torch.py``, same input and thread count) over the kernel's, > 1 = geomx
faster. torch comes from this Python or ``--torch-python PATH`` (a venv with torch);
without it the columns say so and stay empty.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from geomx.codec import BF16Codec, BiSparseCodec, FP16Codec, OneBitCodec, decode
from geomx.codec import reference as ref


@dataclass
class Row:
    op: str
    kernel_s: float
    numpy_s: float | None
    target: str = ""
    ok: bool | None = None
    #: the same operation the torch way (bench/codecs_torch.py), and its best seconds
    torch_op: str = ""
    torch_s: float | None = None
    #: values a sparsifying encode kept (torch's top-k keeps as many)
    sent: int = 0


def best_of(fn: Callable[[], object], repeat: int, setup: Callable[[], None] | None = None) -> float:
    if setup:
        setup()
    fn()  # warm-up (compiles on the first run, loads the cache after)
    best = float("inf")
    for _ in range(repeat):
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def paired(kernel: Callable[[], object], numpy_fn: Callable[[], object], repeat: int,
           setup: Callable[[], None] | None = None) -> tuple[float, float]:
    """Best-of times of the kernel and of numpy, their repetitions interleaved, so that
    both see the same machine (this host's two cores are shared: load comes and goes)."""
    tk = tn = float("inf")
    for fn in (kernel, numpy_fn):  # warm-up
        if setup:
            setup()
        fn()
    for _ in range(repeat):
        for which, fn in ((0, kernel), (1, numpy_fn)):
            if setup:
                setup()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if which == 0:
                tk = min(tk, dt)
            else:
                tn = min(tn, dt)
    return tk, tn


def gbps(n: int, s: float) -> float:
    return 4.0 * n / s / 1e9


def cpu_rows(n: int, repeat: int, threshold: float, seed: int) -> list[Row]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    rows: list[Row] = []

    # -- fp16
    fp16 = FP16Codec()
    enc16 = fp16.encode(0, x)
    assert np.array_equal(enc16.arrays[0].view(np.uint16), ref.f32_to_f16(x).view(np.uint16)), "fp16 mismatch"
    t_k, t_np = paired(lambda: fp16.encode(0, x), lambda: ref.f32_to_f16(x), repeat)
    rows.append(Row("fp16 encode", t_k, t_np, ">= 4x numpy astype", t_np / t_k >= 4,
                    torch_op="fp16 encode"))
    out = np.empty(n, np.float32)
    h = enc16.arrays[0]
    t_k, t_np = paired(lambda: decode(enc16, out=out), lambda: np.copyto(out, h), repeat)
    rows.append(Row("fp16 decode", t_k, t_np, torch_op="fp16 decode"))

    # -- bf16
    bf16 = BF16Codec()
    encb = bf16.encode(0, x)
    assert np.array_equal(encb.arrays[0], ref.f32_to_bf16(x)), "bf16 mismatch"
    t_k, t_np = paired(lambda: bf16.encode(0, x), lambda: ref.f32_to_bf16(x), repeat)
    rows.append(Row("bf16 encode", t_k, t_np, torch_op="bf16 encode"))
    hb = encb.arrays[0]
    t_k, t_np = paired(lambda: decode(encb, out=out), lambda: ref.bf16_to_f32(hb), repeat)
    rows.append(Row("bf16 decode", t_k, t_np, torch_op="bf16 decode"))
    del encb, hb, enc16, h

    # -- Bi-Sparse: state after one warm round, restored before every repetition
    bsc = BiSparseCodec(threshold, size_lower_bound=0)
    state = bsc.new_state(n)
    bsc.encode(7, rng.standard_normal(n, dtype=np.float32), state)
    u0, v0, round0 = state.u.copy(), state.v.copy(), state.round
    ru, rv = u0.copy(), v0.copy()

    def restore() -> None:
        np.copyto(state.u, u0)
        np.copyto(state.v, v0)
        state.round = round0
        np.copyto(ru, u0)
        np.copyto(rv, v0)

    size, top_k = bsc.sample_plan(n)
    cap = bsc.capacity(n)

    def numpy_push() -> tuple[np.ndarray, np.ndarray]:
        pos = bsc.sample_positions(n, 7, round0)
        return ref.bsc_push(x, ru, rv, bsc.momentum, pos, top_k, cap)

    restore()
    enc = bsc.encode(7, x, state)
    rvals, ridx = numpy_push()
    assert np.array_equal(enc.arrays[0], rvals) and np.array_equal(enc.arrays[1], ridx), "bsc mismatch"
    assert np.array_equal(state.v, rv) and np.array_equal(state.u, ru), "bsc state mismatch"
    t_k, t_np = paired(lambda: bsc.encode(7, x, state), numpy_push, repeat, restore)
    rows.append(Row(f"bsc encode (r={threshold:g}, {enc.arrays[0].size} sent)", t_k, t_np,
                    ">= 3x numpy and >= 1.5 GB/s", t_np / t_k >= 3 and gbps(n, t_k) >= 1.5,
                    torch_op="top-k sparsify", sent=int(enc.arrays[0].size)))

    acc = np.zeros(n, np.float32)
    vals, idx = enc.arrays
    t_k, t_np = paired(lambda: decode(enc, out=acc, accumulate=True), lambda: ref.scatter_add(acc, idx, vals), repeat)
    rows.append(Row("bsc decode (scatter-add into out)", t_k, t_np, ">= 5 GB/s", gbps(n, t_k) >= 5,
                    torch_op="scatter-add decode"))
    def numpy_dense() -> np.ndarray:
        o = np.zeros(n, np.float32)
        o[idx] = vals
        return o

    t_k, t_np = paired(lambda: decode(enc), numpy_dense, repeat)
    rows.append(Row("bsc decode (new dense array)", t_k, t_np, torch_op="dense decode"))

    # pull side: the GS re-sparsifies the sum of D = 2 pushes
    agg = np.zeros(n, np.float32)
    decode(enc, out=agg, accumulate=True)
    enc2 = bsc.encode(7, rng.standard_normal(n, dtype=np.float32), bsc.new_state(n))
    decode(enc2, out=agg, accumulate=True)
    pcap = bsc.pull_capacity(n, 2)
    t_k, t_np = paired(lambda: bsc.encode_pull(7, agg, sources=2), lambda: ref.bsc_pull(agg, pcap), repeat)
    rows.append(Row("bsc pull encode (D=2)", t_k, t_np))
    del agg, enc2, acc, u0, v0, ru, rv, state

    # -- onebit
    ob = OneBitCodec()
    ost = ob.new_state(n)
    ob.encode(0, rng.standard_normal(n, dtype=np.float32), ost)
    r0 = ost.residual.copy()
    rr = r0.copy()

    def orestore() -> None:
        np.copyto(ost.residual, r0)
        np.copyto(rr, r0)

    t_k, t_np = paired(lambda: ob.encode(0, x, ost), lambda: ref.onebit_encode(x, rr), repeat, orestore)
    rows.append(Row("onebit encode (EF)", t_k, t_np, torch_op="onebit encode"))
    orestore()
    eo = ob.encode(0, x, ost)
    t_k, t_np = paired(lambda: decode(eo, out=out), lambda: ref.onebit_decode(eo.arrays[0], eo.arrays[1][0], n), repeat)
    rows.append(Row("onebit decode", t_k, t_np, torch_op="onebit decode"))
    return rows


def cuda_rows(n: int, repeat: int, threshold: float, seed: int) -> list[Row]:
    from numba import cuda

    rng = np.random.default_rng(seed)
    x = cuda.to_device(rng.standard_normal(n, dtype=np.float32))

    def timed(fn: Callable[[], object], setup: Callable[[], None] | None = None) -> float:
        def run() -> None:
            fn()
            cuda.synchronize()

        def prep() -> None:
            if setup:
                setup()
            cuda.synchronize()

        return best_of(run, repeat, prep)

    rows: list[Row] = []
    out = cuda.device_array(n, np.float32)
    for codec in (FP16Codec(), BF16Codec()):
        enc = codec.encode(0, x)
        rows.append(Row(f"cuda {codec.name} encode", timed(lambda c=codec: c.encode(0, x)), None))
        rows.append(Row(f"cuda {codec.name} decode", timed(lambda e=enc: decode(e, out=out)), None))
    bsc = BiSparseCodec(threshold, size_lower_bound=0)
    st = bsc.new_state(n, like=x)
    bsc.encode(7, x, st)
    u0 = st.u.copy_to_host()
    v0 = st.v.copy_to_host()

    def restore() -> None:
        st.u.copy_to_device(u0)
        st.v.copy_to_device(v0)
        st.round = 1

    rows.append(Row("cuda bsc encode", timed(lambda: bsc.encode(7, x, st), restore), None))
    restore()
    enc = bsc.encode(7, x, st)
    rows.append(Row("cuda bsc decode (scatter-add)", timed(lambda: decode(enc, out=out, accumulate=True)), None))
    ob = OneBitCodec()
    ost = ob.new_state(n, like=x)
    rows.append(Row("cuda onebit encode", timed(lambda: ob.encode(0, x, ost)), None))
    eo = ob.encode(0, x, ost)
    rows.append(Row("cuda onebit decode", timed(lambda: decode(eo, out=out)), None))
    return rows


def _gpu_name() -> str:
    from numba import cuda

    try:
        name = cuda.get_current_device().name
    except AttributeError:  # the simulator
        return "numba CUDA simulator"
    return name.decode() if isinstance(name, bytes) else str(name)


def print_table(title: str, n: int, rows: list[Row], copy_s: float | None = None) -> None:
    print(f"\n{title}: N = {n:,} fp32 ({4 * n / 1e6:.0f} MB), GB/s of fp32 input, best of the repeats")
    head = f"{'operation':<40} {'kernel ms':>10} {'GB/s':>7} {'numpy ms':>10} {'GB/s':>7} {'speedup':>8}"
    if copy_s:
        head += f" {'of copy':>8} {'torch GB/s':>10} {'x torch':>8}"
    head += "  target"
    print(head)
    print("-" * len(head) + "-" * 10)
    for r in rows:
        np_ms = f"{r.numpy_s * 1e3:10.2f}" if r.numpy_s else f"{'-':>10}"
        np_gb = f"{gbps(n, r.numpy_s):7.2f}" if r.numpy_s else f"{'-':>7}"
        sp = f"{r.numpy_s / r.kernel_s:7.1f}x" if r.numpy_s else f"{'-':>8}"
        verdict = "" if r.ok is None else ("  ok" if r.ok else "  MISSED")
        extra = ""
        if copy_s:
            extra = f" {copy_s / r.kernel_s:7.0%} "
            extra += (f" {gbps(n, r.torch_s):10.2f} {r.torch_s / r.kernel_s:7.2f}x" if r.torch_s
                      else f" {'-':>10} {'-':>8}")
        print(f"{r.op:<40} {r.kernel_s * 1e3:10.2f} {gbps(n, r.kernel_s):7.2f} {np_ms} {np_gb} {sp}"
              f"{extra}  {r.target}{verdict}")


def torch_columns(n: int, rows: list[Row], repeat: int, seed: int,
                  torch_python: str, threads: int) -> str:
    """Fill ``Row.torch_s`` from bench/codecs_torch.py, in this process when torch imports
    here, else under ``torch_python``; returns a line saying which torch ran, or why none."""
    k = next((r.sent for r in rows if r.sent), 1)
    if torch_python:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "codecs_torch.py")
        r = subprocess.run([torch_python, here, "--n", str(n), "--repeat", str(repeat),
                            "--threads", str(threads), "--k", str(k), "--seed", str(seed)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return f"torch columns skipped: {torch_python} failed: {r.stderr.strip()[-300:]}"
        times = json.loads(r.stdout.strip().splitlines()[-1])
        where = f"torch {times['torch_version']} under {torch_python} (its own process)"
    else:
        try:
            import torch  # noqa: F401
        except ImportError:
            return ("torch columns skipped: torch is not installed "
                    "(pip install '.[peers]', or --torch-python PATH)")
        from codecs_torch import torch_times

        times = torch_times(n, repeat, threads, k, seed)
        where = f"torch {times['torch_version']} in this process"
    for row in rows:
        if row.torch_op:
            row.torch_s = times[row.torch_op]
    return f"{where}, {threads} threads; its own np.copyto: {gbps(n, times['memcpy']):.2f} GB/s"


#: Sizes of ``--launch``: below, around and far above PARALLEL_MIN.
LAUNCH_SIZES = (10_000, 100_000, 25_000_000)


def per_call(fn: Callable[[], object], budget_s: float, max_calls: int = 2000) -> tuple[float, float, int]:
    """Median and 90th percentile seconds of back-to-back calls for ``budget_s`` (at least 5
    calls): unlike best-of, the percentiles show the calls that waited for a thread."""
    fn()
    times: list[float] = []
    end = time.perf_counter() + budget_s
    while (time.perf_counter() < end or len(times) < 5) and len(times) < max_calls:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.9)], len(times)


def launch_rows(threshold: float, seed: int) -> None:
    """Per-call time of fp16 encode/decode and Bi-Sparse encode at :data:`LAUNCH_SIZES`:
    what a parallel kernel launch costs when the host is loaded (``--busy``)."""
    for n in LAUNCH_SIZES:
        x = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
        fp16 = FP16Codec()
        enc = fp16.encode(0, x)
        out = np.empty(n, np.float32)
        bsc = BiSparseCodec(threshold, size_lower_bound=0)
        state = bsc.new_state(n)
        budget_s = 1.5 if n < 1_000_000 else 4.0
        for name, fn in (("fp16 encode", lambda: fp16.encode(0, x)),
                         ("fp16 decode", lambda: decode(enc, out=out)),
                         ("bsc encode", lambda: bsc.encode(0, x, state))):
            med, p90, calls = per_call(fn, budget_s)
            print(f"n={n:>11,d}  {name:12s} median {med * 1e3:9.3f} ms  p90 {p90 * 1e3:9.3f} ms  ({calls} calls)",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, default=25_000_000, help="elements (default 25M)")
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions, best kept (default 5)")
    ap.add_argument("--threshold", type=float, default=0.01, help="Bi-Sparse kept fraction (default 0.01)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cuda", action="store_true", help="also run the CUDA kernels (needs a GPU)")
    ap.add_argument("--torch-python", default="",
                    help="a Python with torch for the torch CPU columns (default: this one, if "
                         "torch imports)")
    ap.add_argument("--no-torch", action="store_true", help="leave out the torch CPU columns")
    ap.add_argument("--launch", action="store_true",
                    help="instead: median and p90 per-call time at 10k, 100k and 25M elements")
    ap.add_argument("--busy", type=int, default=0,
                    help="with --launch: run this many busy-loop processes meanwhile (a loaded host)")
    args = ap.parse_args(argv)
    n = int(args.n)
    import numba

    print(f"numpy {np.__version__}, numba {numba.__version__}, {numba.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (a shared host: compare ratios)")
    if args.launch:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            time.sleep(0.5 if busy else 0)
            launch_rows(args.threshold, args.seed)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        return 0
    t0 = time.perf_counter()
    rows = cpu_rows(n, args.repeat, args.threshold, args.seed)
    # the machine's memory copy speed, the ceiling for a codec that reads and writes once
    x = np.random.default_rng(args.seed).standard_normal(n, dtype=np.float32)
    out = np.empty_like(x)
    copy_s = best_of(lambda: np.copyto(out, x), args.repeat)
    del x, out
    torch_line = ("torch columns left out (--no-torch)" if args.no_torch else
                  torch_columns(n, rows, args.repeat, args.seed, args.torch_python,
                                numba.get_num_threads()))
    print_table("CPU (Numba kernels vs numpy; of copy = copy time / kernel time)", n, rows, copy_s)
    print(f"np.copyto of the same array: {copy_s * 1e3:.2f} ms, {gbps(n, copy_s):.2f} GB/s; {torch_line}")
    if args.cuda:
        from numba import cuda

        if not cuda.is_available():
            print("\n--cuda: no CUDA GPU available, skipped")
        else:
            print_table(f"CUDA ({_gpu_name()})", n, cuda_rows(n, args.repeat, args.threshold, args.seed))
    print(f"\n(total {time.perf_counter() - t0:.1f} s, load average at the end {os.getloadavg()[0]:.2f})")
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
