"""The transfer-scheduler API (geomx/policy/scheduling.py): built-ins found by name and
built once per job with typed options, several schedulers' sides composed into one, and
a scheduler written outside geomx changing how values travel in an emulated job."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from geomx.experiment import JobFailed, run_scenario
from geomx.policy import PolicyError, policy_class
from geomx.policy.scheduling import (HELD, SchedGlobalSide, SchedLocalSide, SchedWorkerSide,
                                     TransferScheduler, global_side_of, local_side_of,
                                     sync_problem_of, worker_side_of)
from geomx.sched.dgt import Dgt, DgtSettings
from geomx.sched.p3 import P3, P3Options
from geomx.sched.ts_overlay import TsEngine
from geomx.sched.tsengine import TsSettings
from geomx.wire import Kind, Message
from tests.helpers.events import run_events

SHORT = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")


def test_builtin_schedulers_resolve_by_their_scenario_names():
    assert policy_class("sched", "p3") is P3 and P3.Options is P3Options
    assert policy_class("sched", "dgt") is Dgt and Dgt.Options is DgtSettings
    assert policy_class("sched", "tsengine") is TsEngine and TsEngine.Options is TsSettings
    with pytest.raises(PolicyError, match="unknown sched policy 'p4'; allowed: 'p3', 'dgt'"):
        policy_class("sched", "p4")


def test_a_scheduler_in_a_file_loads_and_a_non_scheduler_is_refused(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text("from geomx.policy import TransferScheduler\n"
                 "class Mine(TransferScheduler):\n    name = 'mine'\n"
                 "class NotOne:\n    pass\n")
    assert policy_class("sched", f"{f}:Mine").__name__ == "Mine"
    with pytest.raises(PolicyError, match="NotOne is not a sched policy"):
        policy_class("sched", f"{f}:NotOne")


def test_the_plan_builds_each_scheduler_once_with_typed_options(scenario_of):
    from geomx.cluster import plan_job

    job = plan_job(scenario_of("dgt.toml", "sched.dgt=tcp", "sched.dgt_k=0.4",
                               "sched.p3=true", "sched.p3_slice_elements=500")).job
    p3, dgt = job.transfer_schedulers
    assert isinstance(p3, P3) and p3.options == P3Options(slice_elements=500)
    assert isinstance(dgt, Dgt) and dgt.options.mode == "tcp" and dgt.options.k == 0.4
    job = plan_job(scenario_of("tsengine.toml")).job
    (ts,) = job.transfer_schedulers
    assert isinstance(ts, TsEngine) and ts.options.inter
    assert sync_problem_of(job.transfer_schedulers, "mixed").startswith("set_sync: a dist_async")
    assert sync_problem_of((p3, dgt), "mixed") is None
    with pytest.raises(ValueError, match="dgt mode 'sideways'"):
        DgtSettings(mode="sideways")


# ---------------------------------------------------------------- composition

class _Sched(TransferScheduler):
    name = "test"

    def __init__(self, worker: Any = None, local: Any = None, glob: Any = None):
        super().__init__()
        self.sides = worker, local, glob

    def worker_side(self, ctx):
        return self.sides[0]

    def local_side(self, ctx):
        return self.sides[1]

    def global_side(self, ctx):
        return self.sides[2]


class _Slicer(SchedWorkerSide):
    plain = False
    orders_by_priority = True

    def slices(self, key, n):
        return [(key, 0, n // 2), (key + 1, n // 2, n)]

    def push_meta(self, meta):
        meta["a"] = 1


class _Loss(SchedWorkerSide):
    carries_loss = True

    def push_meta(self, meta):
        meta["b"] = 2

    async def pull_replies(self, key):
        return ([Message(Kind.PUSH_ACK, "ls", "w", key=key)], False) if key == 7 else None


def test_worker_sides_compose_decisions_fall_through_additions_all_run():
    assert worker_side_of([], None) is None
    one = _Loss()
    assert worker_side_of([_Sched(one), _Sched()], None) is one  # one side: itself
    side = worker_side_of([_Sched(_Loss()), _Sched(_Slicer())], None)
    assert side is not None
    assert (side.plain, side.orders_by_priority, side.carries_loss) == (False, True, True)
    assert side.slices(4, 10) == [(4, 0, 5), (5, 5, 10)]  # the first side has no opinion
    meta: dict[str, Any] = {}
    side.push_meta(meta)
    assert meta == {"b": 2, "a": 1}  # every side, in the job's order
    assert asyncio.run(side.pull_replies(3)) is None
    replies, unread = asyncio.run(side.pull_replies(7))
    assert replies[0].key == 7 and unread is False


class _Blocks(SchedLocalSide):
    async def push_part(self, dst, key, part, round_, value, meta):
        return Message(Kind.PUSH_ACK, dst, "ls", key=key, part=part) if part == 1 else None

    def command_problem(self, cmd):
        return "no" if cmd == "x" else None


class _Fused(SchedLocalSide):
    def acks_carry_value(self, acks):
        return True

    def reply_carries_value(self, push):
        return push.meta.get("fuse", False)


def test_local_sides_compose():
    side = local_side_of([_Sched(local=_Blocks()), _Sched(local=_Fused())], None)
    assert asyncio.run(side.push_part("gs:0", 3, 1, 5, None, {})).part == 1
    assert asyncio.run(side.push_part("gs:0", 3, 0, 5, None, {})) is None
    assert side.acks_carry_value([]) is True
    assert side.reply_carries_value(Message(Kind.PUSH, "w", "ls", meta={"fuse": True}))
    assert side.command_problem("x") == "no" and side.command_problem("y") is None


class _Piece(SchedGlobalSide):
    def decode_push(self, msg, like):
        return HELD if msg.meta.get("piece") else None


class _Whole(SchedGlobalSide):
    def decode_push(self, msg, like):
        return "value"


def test_global_sides_compose_a_held_piece_stops_the_chain():
    side = global_side_of([_Sched(glob=_Piece()), _Sched(glob=_Whole())], None)
    assert side.decode_push(Message(Kind.PUSH, "ls", "gs", meta={"piece": 1}), None) is HELD
    assert side.decode_push(Message(Kind.PUSH, "ls", "gs"), None) == "value"


# ---------------------------------------------------------------- a user scheduler

class FusedPulls(TransferScheduler):
    """Push/pull fusion without slicing, on both tiers: a user's scheduler."""

    name = "fused_pulls"

    def worker_side(self, ctx):
        return _FuseWorker(ctx)

    def local_side(self, ctx):
        return _FuseLocal()

    def global_side(self, ctx):
        return _FuseGlobal()


class _FuseWorker(SchedWorkerSide):
    plain = False

    def __init__(self, ctx):
        self.ctx = ctx
        self.acks: dict[int, list[Message]] = {}

    def push_meta(self, meta):
        meta["fuse"] = True

    def pushed(self, key, acks, **_):
        if all(a.payloads for a in acks):
            self.acks[key] = list(acks)
            self.ctx.record("fused_ack", key=key)

    async def pull_replies(self, key):
        acks = self.acks.pop(key, None)
        return None if acks is None else (acks, False)


class _FuseLocal(SchedLocalSide):
    def global_push_meta(self, meta):
        meta["fuse"] = True

    def acks_carry_value(self, acks):
        return all(a.payloads for a in acks)

    def reply_carries_value(self, push):
        return bool(push.meta.get("fuse"))


class _FuseGlobal(SchedGlobalSide):
    def reply_carries_value(self, push):
        return bool(push.meta.get("fuse"))


def _pulls(events):
    return sum(1 for e in events if e["ev"] == "xfer" and e["msg"] == "PULL")


def test_a_user_scheduler_removes_the_pull_round_trips(scenario_of):
    """Named in the scenario (``[sched] policy = "package.module:Class"``), as a user
    names theirs."""
    args = ("run.iterations=3", *SHORT)
    plain = run_events(run_scenario(scenario_of("quickstart.toml", *args)).run_dir)
    r = run_scenario(scenario_of("quickstart.toml", *args,
                                 "sched.policy=tests.sched.test_scheduling_api:FusedPulls"))
    events = run_events(r.run_dir)
    fused = [e for e in events if e["ev"] == "fused_ack"]
    workers = {e["node"] for e in fused}
    assert len(workers) >= 2 and len(fused) == 3 * len(workers) * 4  # 3 steps x 4 keys
    # only the initial pulls are left (each worker's and each local server's first pull)
    assert _pulls(events) < _pulls(plain) / 2


class _Slices(SchedWorkerSide):
    plain = False

    def __init__(self, wire_key):
        self.wire_key = wire_key

    def slices(self, key, num_elements):
        if num_elements <= 500:
            return None
        step = -(-num_elements // 3)
        return [(self.wire_key(key, i), lo, min(lo + step, num_elements))
                for i, lo in enumerate(range(0, num_elements, step))]


class ThirdsBySliceKey(TransferScheduler):
    """Every key of more than 500 elements in three slices, numbered by slice_key."""

    def worker_side(self, ctx):
        from geomx.policy import slice_key
        return _Slices(slice_key)


class ThirdsByHand(TransferScheduler):
    """The same slices numbered key * 1000 + i: key 0's slice 1 is key 1."""

    def worker_side(self, ctx):
        return _Slices(lambda key, i: key * 1000 + i)


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_user_scheduler_slicing_with_slice_key_trains_as_unsliced(scenario_of, runtime):
    args = ("run.iterations=3", *SHORT)
    plain = run_scenario(scenario_of("quickstart.toml", *args), runtime=runtime)
    r = run_scenario(scenario_of("quickstart.toml", *args,
                                 "sched.policy=tests.sched.test_scheduling_api:ThirdsBySliceKey"),
                     runtime=runtime)
    pushed = {e["key"] for e in run_events(r.run_dir) if e["ev"] in ("xfer", "send")
              and e["msg"] == "PUSH" and e["src"].startswith("w:")}
    assert len(pushed) == 2 * 3 + 2  # the two large keys in thirds, two small ones whole
    assert (r.summary.extra["final_eval"]["accuracy"]
            == plain.summary.extra["final_eval"]["accuracy"])


class _Overlapping(SchedWorkerSide):
    plain = False

    def slices(self, key, num_elements):
        from geomx.policy import slice_key
        if num_elements <= 500:
            return None
        return [(key, 0, num_elements // 2), (slice_key(key, 1), num_elements // 3,
                                              num_elements)]


class Overlapping(TransferScheduler):
    def worker_side(self, ctx):
        return _Overlapping()


@pytest.mark.parametrize("scheduler, problem", [
    ("ThirdsByHand", r"key 1: the transfer scheduler's slices: wire key 1 is also key 0's; "
                     r"number slices with geomx.policy.slice_key"),
    ("Overlapping", r"key 0: the transfer scheduler's slices: slice 1 \(720720001, 1365, "
                    r"4096\) should cover elements from 2048, within \[0, 4096\)"),
])
def test_slices_that_cannot_travel_are_refused_naming_the_keys(scenario_of, scheduler, problem):
    s = scenario_of("quickstart.toml", "run.iterations=3", *SHORT,
                    f"sched.policy=tests.sched.test_scheduling_api:{scheduler}")
    with pytest.raises(JobFailed, match=problem):
        run_scenario(s)
