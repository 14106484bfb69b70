"""The virtual-time loop: plain asyncio code runs unchanged, time autojumps."""

from __future__ import annotations

import asyncio
import time

import pytest

from geomx.sim.loop import EmulationDeadlock, VirtualTimeLoop, new_virtual_loop, run_virtual


def test_an_hour_of_sleep_takes_no_wall_time_and_exactly_an_hour_of_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - t0

    wall0 = time.perf_counter()
    assert run_virtual(main()) == 3600.0
    assert time.perf_counter() - wall0 < 0.5


def test_start_time_sets_the_clock():
    async def main():
        await asyncio.sleep(1.5)
        return asyncio.get_running_loop().time()

    assert run_virtual(main(), start_time=100.0) == 101.5


def test_wait_for_times_out_at_the_right_virtual_instant():
    async def main():
        loop = asyncio.get_running_loop()
        never = asyncio.Event()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(never.wait(), timeout=2.5)
        t_wait_for = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.25):
                await asyncio.sleep(10)
        return t_wait_for, loop.time()

    assert run_virtual(main()) == (2.5, 2.75)


def test_wait_for_returns_early_when_the_result_comes_first():
    async def main():
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[str] = asyncio.Queue()

        async def producer():
            await asyncio.sleep(0.7)
            q.put_nowait("x")

        task = asyncio.create_task(producer())
        got = await asyncio.wait_for(q.get(), timeout=5)
        await task
        return got, loop.time()

    assert run_virtual(main()) == ("x", 0.7)


def test_timers_fire_in_deadline_order_and_fifo_among_equal_deadlines():
    async def main():
        order = []

        async def sleeper(tag, delay):
            await asyncio.sleep(delay)
            order.append((tag, asyncio.get_running_loop().time()))

        await asyncio.gather(*(sleeper(i, d) for i, d in enumerate([3, 1, 2, 1, 1])))
        return order

    assert run_virtual(main()) == [(1, 1), (3, 1), (4, 1), (2, 2), (0, 3)]


def test_deadlock_is_reported_instead_of_hanging():
    async def main():
        await asyncio.sleep(5)
        await asyncio.Event().wait()

    with pytest.raises(EmulationDeadlock, match=r"virtual time 5 s"):
        run_virtual(main())


def test_deadlock_between_two_tasks_names_them():
    async def main():
        a, b = asyncio.Queue(), asyncio.Queue()

        async def ping():
            await a.get()
            b.put_nowait(1)

        t = asyncio.create_task(ping(), name="pinger")
        await b.get()
        await t

    with pytest.raises(EmulationDeadlock, match="pinger"):
        run_virtual(main())


def test_pending_tasks_are_cancelled_when_main_returns():
    cancelled = []

    async def main():
        async def forever():
            try:
                await asyncio.sleep(1e9)
            except asyncio.CancelledError:
                cancelled.append(asyncio.get_running_loop().time())
                raise

        asyncio.create_task(forever())
        await asyncio.sleep(1)
        return "done"

    assert run_virtual(main()) == "done"
    assert cancelled == [1.0]


def test_exceptions_propagate():
    async def main():
        await asyncio.sleep(1)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        run_virtual(main())


def test_cancelled_timers_do_not_advance_the_clock():
    async def main():
        loop = asyncio.get_running_loop()
        for _ in range(1000):
            h = loop.call_later(100.0, lambda: None)
            h.cancel()
        await asyncio.sleep(1)
        return loop.time()

    assert run_virtual(main()) == 1.0


def test_idle_callbacks_run_after_everything_at_the_instant_before_time_moves():
    async def main():
        loop = asyncio.get_running_loop()
        log = []
        loop.call_when_idle(lambda: log.append(("idle", loop.time())))
        loop.call_soon(lambda: log.append(("soon", loop.time())))
        loop.call_later(1.0, lambda: log.append(("later", loop.time())))
        await asyncio.sleep(0)
        log.append(("main", loop.time()))
        await asyncio.sleep(2)
        return log

    assert run_virtual(main()) == [("soon", 0.0), ("main", 0.0), ("idle", 0.0), ("later", 1.0)]


def test_same_program_gives_the_same_callback_order():
    async def main():
        loop = asyncio.get_running_loop()
        log = []

        async def worker(i):
            for k in range(20):
                await asyncio.sleep(((i * 7 + k * 3) % 5) * 0.1)
                log.append((i, k, round(loop.time(), 9)))

        await asyncio.gather(*(worker(i) for i in range(8)))
        return log

    assert run_virtual(main()) == run_virtual(main())


def test_plain_entries_run_in_fifo_order_with_handles_and_in_their_context():
    import contextvars

    var = contextvars.ContextVar("var", default="loop")

    async def main():
        loop = asyncio.get_running_loop()
        log = []
        var.set("mine")
        ctx = contextvars.copy_context()
        append, entry = loop.soon_plain_entry(ctx.run, lambda: log.append(("plain", var.get())))
        loop.call_soon(lambda: log.append(("soon1", var.get())))
        append(entry)
        loop.call_soon(lambda: log.append(("soon2", var.get())))
        append(entry)  # reusable: runs once per append
        loop.call_at_plain(loop.time(), lambda arg: log.append((arg, var.get())), "timer")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return log

    assert run_virtual(main()) == [("soon1", "mine"), ("plain", "mine"), ("soon2", "mine"),
                                   ("plain", "mine"), ("timer", "loop")]


def test_garbage_collection_is_paced_by_callbacks_while_the_loop_runs(monkeypatch):
    import gc
    import weakref

    import geomx.sim.loop as sim_loop

    monkeypatch.setattr(sim_loop, "_GC_EVERY_CALLBACKS", 500)

    class Cycle:
        pass

    async def main():
        enabled_inside = gc.isenabled()
        c = Cycle()
        c.me = c  # cyclic garbage: only the collector frees it
        gone = weakref.ref(c)
        del c
        for _ in range(2000):  # > 500 callbacks
            await asyncio.sleep(0)
        return enabled_inside, gone() is None

    assert gc.isenabled()
    assert run_virtual(main()) == (False, True)
    assert gc.isenabled()  # restored


def test_garbage_collection_spaces_out_when_much_is_in_flight(monkeypatch):
    """A young collection walks every young object still alive; with many in flight the
    loop waits proportionally longer before the next one (counted, not timed)."""
    import gc

    import geomx.sim.loop as sim_loop

    monkeypatch.setattr(sim_loop, "_GC_EVERY_CALLBACKS", 500)

    def collections_with(in_flight: int) -> int:
        seen = []

        def count(phase, info):
            if phase == "start":
                seen.append(info["generation"])

        async def main():
            held = [[] for _ in range(in_flight)]  # young, alive across collections
            for _ in range(20_000):
                await asyncio.sleep(0)
            return len(held)

        gc.callbacks.append(count)
        try:
            assert run_virtual(main()) == in_flight
        finally:
            gc.callbacks.remove(count)
        return len(seen)

    few = collections_with(0)
    assert few >= 15  # every 500 callbacks, as before
    # 10k objects walked by the first collection: the next is >= 80k callbacks away
    assert collections_with(10_000) <= 2
    monkeypatch.setattr(sim_loop, "_GC_CALLBACKS_PER_YOUNG_OBJECT", 0)
    assert collections_with(10_000) >= 15


def test_old_cyclic_garbage_goes_during_a_long_run(monkeypatch):
    """A cycle promoted to the oldest generation (it outlived collections while in use,
    like a message queued behind a slow WAN link) is freed while the loop still runs."""
    import gc
    import weakref

    import geomx.sim.loop as sim_loop

    monkeypatch.setattr(sim_loop, "_GC_EVERY_CALLBACKS", 200)

    class Cycle:
        pass

    async def main():
        c = Cycle()
        c.me = c
        gone = weakref.ref(c)
        gc.collect()  # in use during a full collection: now in the oldest generation
        del c
        seen = []
        for _ in range(30_000):  # 150 paced collections: one full one among them
            await asyncio.sleep(0)
            if gone() is None:
                seen.append(True)
                break
        return bool(seen)

    assert run_virtual(main()) is True


def test_loop_can_be_driven_directly():
    loop = new_virtual_loop(start_time=10.0)
    assert isinstance(loop, VirtualTimeLoop)
    try:
        assert loop.run_until_complete(asyncio.sleep(2, result="ok")) == "ok"
        assert loop.time() == 12.0
    finally:
        loop.close()


def test_many_timers_run_fast():
    async def main():
        async def tick(n):
            for _ in range(n):
                await asyncio.sleep(0.001)

        await asyncio.gather(*(tick(2000) for _ in range(10)))
        return asyncio.get_running_loop().time()

    wall0 = time.perf_counter()
    assert run_virtual(main()) == pytest.approx(2.0)
    assert time.perf_counter() - wall0 < 1.5


def test_threads_are_refused_with_an_explanation():
    async def main():
        await asyncio.to_thread(sum, [1, 2])

    with pytest.raises(NotImplementedError, match="virtual time"):
        run_virtual(main())


def test_polling_with_sleep0_is_reported_as_a_livelock():
    from geomx.sim.loop import EmulationLivelock

    async def main():
        loop = asyncio.get_running_loop()
        loop.max_iterations_per_instant = 10_000
        flag = []
        loop.call_later(1.0, flag.append, 1)  # never fires: time cannot advance
        while not flag:
            await asyncio.sleep(0)

    with pytest.raises(EmulationLivelock, match="sleep\\(0\\)"):
        run_virtual(main())
