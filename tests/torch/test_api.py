"""``geomx.torch`` in the emulator: host staging (the code path of GPU tensors, run on
CPU tensors), the compute ``step()`` charges, backward passes per step, FP16, and the
model every worker starts from."""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers.events import run_events
from tests.torch.helpers import PROGRAM, pushes, run


def test_host_staging_buffers_copy_both_ways():
    from geomx.torch.tensors import HostBuffers

    p = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    p.grad = torch.full((2, 3), 2.0)
    b = HostBuffers([p, torch.zeros(4)], stage=True)
    assert b.staged == [True, True]
    w = b.weights_from_device()
    assert np.array_equal(w[0], p.numpy()) and not np.shares_memory(w[0], p.numpy())
    g = b.grads_from_device([p.grad, None])
    assert np.array_equal(g[0], np.full((2, 3), 2.0)) and not np.shares_memory(g[0], p.grad.numpy())
    assert np.array_equal(g[1], np.zeros(4))  # an unused parameter pushes zeros
    b.writable_weights()[0][...] = 7.0
    assert float(p[0, 0]) == 0.0
    b.weights_to_device()
    assert torch.equal(p, torch.full((2, 3), 7.0))
    plain = HostBuffers([p])
    assert plain.staged == [False] and np.shares_memory(plain.weights[0], p.numpy())


def test_staged_tensors_train_exactly_as_host_tensors(tmp_path):
    direct = run(tmp_path / "a", [])
    staged = run(tmp_path / "b", [], args=["--stage"])
    assert staged.summary.final_accuracy == direct.summary.final_accuracy
    assert pushes(staged.run_dir) == pushes(direct.run_dir)


def test_step_charges_the_compute_profile_once_per_backward_pass(tmp_path):
    one = run(tmp_path / "one", [], iterations=6)
    two = run(tmp_path / "two", [], args=["--passes", "2"], iterations=6)
    for r, passes in ((one, 1), (two, 2)):
        computes = [e for e in run_events(r.run_dir, "compute") if e["node"] == "w:party-a:0"]
        assert len(computes) == 6 * passes
        assert all(abs(e["dur"] - 0.01) < 1e-9 for e in computes)  # compute_per_iter 10ms
    assert two.summary.emulated_seconds > one.summary.emulated_seconds + 0.05


def test_fp16_compression_halves_what_workers_push(tmp_path):
    dense = run(tmp_path / "a", [], iterations=4)
    half = run(tmp_path / "b", [], args=["--fp16"], iterations=4)

    def pushed(r):
        return sum(e["bytes"] for e in run_events(r.run_dir, "xfer")
                   if e.get("msg") == "PUSH" and e["src"].startswith("w:") and e["key"] >= 0)

    assert 0.45 < pushed(half) / pushed(dense) < 0.6
    assert half.summary.final_accuracy > 0.3


def _start_digests(r):
    return {e["node"]: e["start_digest"] for e in run_events(r.run_dir, "eval")
            if "start_digest" in e}


def test_every_worker_starts_from_the_master_workers_model(tmp_path):
    r = run(tmp_path, [], args=["--bn"], iterations=2)
    digests = _start_digests(r)
    assert len(digests) == 5 and len(set(digests.values())) == 1  # 4 workers + master


def test_broadcast_under_fp16_carries_integer_buffers(tmp_path):
    # the weights arrive FP16-rounded, the same on every worker; BatchNorm's int64
    # num_batches_tracked travels as its bytes (the codecs take float tensors only)
    r = run(tmp_path, [], args=["--bn", "--fp16"], iterations=2)
    workers = {n: d for n, d in _start_digests(r).items() if n.startswith("w:")}
    assert len(workers) == 4 and len(set(workers.values())) == 1


def _early_rows(r, node="w:party-a:0"):
    return [(e["iteration"], e["early"], e["digest"]) for e in run_events(r.run_dir, "eval")
            if e["node"] == node and "early" in e]


def test_gradients_leave_during_backward_only_when_no_compute_is_charged(tmp_path):
    free = ["dc.1.compute_per_iter=0ms", "dc.2.compute_per_iter=0ms"]
    early = run(tmp_path / "early", free, args=["--sgd", "--report-early"], iterations=5)
    rows = _early_rows(early)
    # the first step sets the exchange up; from the second on every gradient of the
    # 4 parameters leaves from its backward hook
    assert [n for _, n, _ in rows] == [0, 4, 4, 4, 4]
    # a synchronous program sends from the same hooks (its thread makes the kvstore calls)
    sync = run(tmp_path / "sync", [*free, f"training.program={PROGRAM}:sync_main"],
               program=False, args=["--sgd", "--report-early"], iterations=5)
    assert _early_rows(sync) == rows
    # the same training as when every gradient waits for step() (staged tensors do)
    late = run(tmp_path / "late", free, args=["--sgd", "--report-early", "--stage"],
               iterations=5)
    assert [n for _, n, _ in _early_rows(late)] == [0] * 5
    assert [d for *_, d in _early_rows(late)] == [d for *_, d in rows]
    assert pushes(late.run_dir) == pushes(early.run_dir)
    # the scenario charges compute (quickstart: 10 ms per iteration): gradients wait for it
    charged = run(tmp_path / "charged", [], args=["--sgd", "--report-early"], iterations=3)
    assert [n for _, n, _ in _early_rows(charged)] == [0, 0, 0]


def test_parameters_train_under_p3_slicing(tmp_path):
    # parameter names are string keys; P3 slices them like int keys
    whole = run(tmp_path / "whole", [], args=["--sgd"], iterations=4)
    sliced = run(tmp_path / "sliced", ["sched.p3=true", "sched.p3_slice_elements=1000"],
                 args=["--sgd"], iterations=4)
    assert pushes(sliced.run_dir)["w"] > pushes(whole.run_dir)["w"]  # 4160-element weights
    assert sliced.summary.final_accuracy == whole.summary.final_accuracy


def test_fp16_compression_reaches_a_flat_ps_workers_pushes(tmp_path):
    # without local servers, the global server tells the workers the master's codec
    flat = ["topology.kind=flat"]
    dense = run(tmp_path / "a", flat, iterations=4)
    half = run(tmp_path / "b", flat, args=["--fp16"], iterations=4)

    def pushed(r):
        return sum(e["bytes"] for e in run_events(r.run_dir, "xfer")
                   if e.get("msg") == "PUSH" and e["src"].startswith("w:") and e["key"] >= 0)

    assert 0.45 < pushed(half) / pushed(dense) < 0.6
