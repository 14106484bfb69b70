"""OpenMP threads for processes that share a host's cores (docs/real-runtime.md, "Threads
per node").

PyTorch starts one intra-op thread per core in every process, and OpenMP threads spin
for a while after every parallel region: several training processes on one host then
keep every core busy spinning and take turns, which stalled iterations by 200-600 ms in
a 4-worker real-runtime job on 2 cores. torchrun sets 1 for the same reason when it
starts several processes per host; here each process gets an equal share of the cores.
The share travels as ``OMP_NUM_THREADS`` (read by torch, OpenBLAS and Numba's OpenMP
layer when they load); :func:`apply_to_torch` gives it to a torch that loaded before the
variable was set, or after a Numba pool left its own count in the OpenMP runtime.
"""

from __future__ import annotations

import sys

#: the variable that sizes OpenMP's thread pool in a process
THREADS_VAR = "OMP_NUM_THREADS"


def threads_per_worker(workers: int, cpus: int | None) -> int:
    """OpenMP threads for each of ``workers`` training processes sharing ``cpus`` cores:
    an equal share, at least one."""
    return max(1, (cpus or 1) // max(1, workers))


def apply_to_torch(value: str | None) -> None:
    """Give an imported torch ``value`` intra-op threads (``OMP_NUM_THREADS``'s text: a
    positive integer; anything else, or no torch loaded, changes nothing)."""
    torch = sys.modules.get("torch")
    if torch is not None and value and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))
