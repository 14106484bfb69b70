"""A user codec named by file runs end to end: in the emulator through
geomx.testing.run_policy, deterministically, over real sockets on the loopback; and a
codec that raises mid-run stops the job with one line naming the policy and the node,
leaving no process behind."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from geomx.experiment import JobFailed, resume_scenario, run_scenario
from geomx.policy.registry import policy_class
from geomx.scenario import load_scenario
from geomx.testing import run_policy, spec_for_class

from tests.helpers.procs import descendants
from tests.policy.conftest import DGC_SPEC, EXAMPLES


def _sha(run) -> str:
    return hashlib.sha256((run.run_dir / "events.jsonl").read_bytes()).hexdigest()


def test_dgc_trains_with_fewer_wan_bytes_and_the_same_log_twice(tmp_path):
    options = {"ratio": 0.05, "size_lower_bound": 500}
    dgc = run_policy(DGC_SPEC, options, kind="codec", iterations=15, out_dir=tmp_path / "a")
    again = run_policy(DGC_SPEC, options, kind="codec", iterations=15, out_dir=tmp_path / "b")
    dense = run_policy("none", kind="codec", iterations=15, out_dir=tmp_path / "c")
    assert dgc.summary.iterations == 15 and dgc.summary.final_accuracy > 0.35
    assert dgc.summary.bytes_wan < 0.85 * dense.summary.bytes_wan
    assert _sha(dgc) == _sha(again)  # deterministic, as the golden-log check requires


def test_run_policy_takes_a_class_and_finds_a_spec_every_node_loads():
    cls = policy_class("codec", DGC_SPEC)
    assert spec_for_class(cls) == DGC_SPEC
    run = run_policy(cls, {"ratio": 0.1}, iterations=3)
    assert run.summary.iterations == 3 and run.events_of("scheduler_done")


def test_a_codec_that_raises_in_a_round_fails_the_job_in_one_line(lab):
    with pytest.raises(JobFailed) as info:
        run_policy(f"{lab / 'boom.py'}:Boom", {"after": 3}, kind="codec", iterations=10)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("node w:party-")
    assert (f"PolicyFailed: codec policy '{lab / 'boom.py'}:Boom' raised in encode() at "
            "boom.py:") in message
    assert message.endswith("RuntimeError: top-k buffer overflow")


@pytest.mark.slow
def test_dgc_over_real_sockets_on_the_loopback(tmp_path):
    s = load_scenario(EXAMPLES / "dgc.toml", ["run.iterations=10", "run.target_accuracy=0",
                                              "metrics.plot=false", "metrics.trace=false"])
    result = run_scenario(s, runtime="real", out_dir=tmp_path, progress=False)
    assert result.summary.runtime == "real" and result.summary.iterations == 10
    assert result.summary.final_accuracy > 0.3 and result.summary.bytes_wan > 0
    emulated = run_scenario(s, runtime="emu", out_dir=tmp_path, progress=False)
    # the same codec sends the same bytes in both runtimes (framing aside)
    assert abs(result.summary.bytes_wan - emulated.summary.bytes_wan) < 0.05 * emulated.summary.bytes_wan


@pytest.mark.slow
def test_a_codec_that_raises_over_sockets_stops_every_process(lab, tmp_path):
    scenario = lab / "job.toml"
    scenario.write_text((EXAMPLES / "dgc.toml").read_text().split("[codec]")[0]
                        + '[codec]\ntype = "boom.py:Boom"\n[codec.options]\nafter = 3\n')
    s = load_scenario(scenario, ["metrics.plot=false", "metrics.trace=false"])
    # processes this test process already had (another test's, in the same pytest
    # worker) are not this job's
    before = set(descendants(os.getpid()))
    with pytest.raises(JobFailed) as info:
        run_scenario(s, runtime="real", out_dir=tmp_path, progress=False)
    assert f"codec policy '{lab / 'boom.py'}:Boom' raised in encode() at boom.py:" in str(info.value)
    left = [p for p in descendants(os.getpid()) if p not in before]
    assert left == [], [_command_line(p) for p in left]


def _command_line(pid: int) -> str:
    try:
        return f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"{pid}: gone"


@pytest.mark.slow
def test_the_checkpoint_written_before_a_policy_failed_resumes_the_job(lab, tmp_path):
    scenario = lab / "ckpt.toml"
    scenario.write_text((EXAMPLES / "dgc.toml").read_text().split("[codec]")[0]
                        + '[codec]\ntype = "boom.py:Boom"\n[codec.options]\nafter = 60\n\n'
                        '[checkpoint]\nevery = 5\n')
    s = load_scenario(scenario, ["run.iterations=40", "run.target_accuracy=0",
                                 "metrics.plot=false", "metrics.trace=false"])
    with pytest.raises(JobFailed, match="raised in encode"):
        run_scenario(s, runtime="emu", out_dir=tmp_path / "a", progress=False)
    (failed,) = (tmp_path / "a").iterdir()
    resumed = resume_scenario(failed, ["codec.options.after=1000000"])
    assert resumed.checkpoint.resume_from.endswith("/15")  # the last one before the failure
    result = run_scenario(resumed, runtime="emu", out_dir=tmp_path / "b", progress=False)
    assert result.summary.iterations == 40 and result.summary.final_accuracy > 0.5
