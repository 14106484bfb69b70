"""Misuse of ``geomx.torch`` fails the job at once with one line naming the parameter
and the node (no hang: the emulator would stop on a deadlock, and every test here
finishes in a few emulated seconds), or the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from geomx.experiment import JobFailed

from tests.torch.helpers import run

BAD = Path(__file__).with_name("bad_programs.py")


def _fails(tmp_path, case, sets=()):
    with pytest.raises(JobFailed) as err:
        run(tmp_path, [f"training.program={BAD}", *sets], program=False,
            args=["--case", case], iterations=6)
    return str(err.value)


def test_named_parameters_that_disagree_name_the_parameter_and_the_node(tmp_path):
    msg = _fails(tmp_path, "extra_parameter")
    assert "named_parameters disagree" in msg and "w:party-b:1" in msg
    assert "'extra.weight'" in msg


def test_a_renamed_parameter_is_named(tmp_path):
    msg = _fails(tmp_path, "renamed")
    assert "'0.1.weight'" in msg and "w:party-b:1" in msg


def test_a_shape_that_changes_between_steps_names_the_parameter_and_the_node(tmp_path):
    msg = _fails(tmp_path, "shape_change")
    assert "'3.bias'" in msg and "w:party-b:1" in msg and "changed shape" in msg


def test_a_device_the_kvstore_cannot_carry_is_named(tmp_path):
    msg = _fails(tmp_path, "meta_device")
    assert "'3.bias'" in msg and "w:party-b:1" in msg and "'meta'" in msg


def test_more_backward_passes_than_declared_is_refused(tmp_path):
    msg = _fails(tmp_path, "two_passes")
    assert "backward_passes_per_step" in msg and "2 backward passes" in msg


def test_a_server_optimizer_geomx_optim_lacks_is_refused_by_name(tmp_path):
    msg = _fails(tmp_path, "server_adam")
    assert "torch.optim.Adam has no identical optimizer in geomx.optim" in msg


def test_an_unknown_compression_lists_the_allowed_ones(tmp_path):
    msg = _fails(tmp_path, "compression")
    assert "compression='zstd'; allowed: Compression.none, Compression.fp16" in msg


def test_a_blocking_step_in_an_async_program_names_the_call_to_use(tmp_path):
    msg = _fails(tmp_path, "blocking_step")
    assert "await optimizer.step_async()" in msg


FREE = ["dc.1.compute_per_iter=0ms", "dc.2.compute_per_iter=0ms"]


def test_a_gradient_changed_after_the_backward_pass_sent_it_is_named(tmp_path):
    # no compute charged: gradients leave from the backward hooks, before the clipping
    msg = _fails(tmp_path, "clip", FREE)
    assert "changed between backward() and step()" in msg and "send_during_backward=False" in msg
    assert re.search(r"parameter '[13]\.(weight|bias)' on node w:party-[ab]:[01]", msg), msg
    # sent from step(), the clipped gradients are what the servers get
    r = run(tmp_path / "late", [f"training.program={BAD}", *FREE], program=False,
            args=["--case", "clip_from_step"], iterations=6)
    assert r.summary.iterations == 6
