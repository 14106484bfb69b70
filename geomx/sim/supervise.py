"""Run every node of an emulated job as a task, inject its crashes, name the first failure.

The emulated counterpart of the real launcher's supervision
(:mod:`geomx.runtime.launcher`): there a node is a process that the launcher watches and
kills; here it is a task on the virtual-time loop, and a ``[[fault]] kind = "crash"``
cancels it at its emulated time and closes its transport, so messages to it are dropped,
as when a process is killed (docs/architecture.md, "sim/ contract").
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from geomx.errors import JobFailed
from geomx.node.base import NodeFailure
from geomx.scenario import Scenario


async def run_nodes(nodes: list[Any], faults: tuple[Any, ...] = (),
                    on_crash: Callable[[str, float], None] | None = None,
                    restart: Callable[[str], Any] | None = None) -> None:
    """Run every node; the first failure cancels the rest and is raised with its name.

    A crash with a duration restarts the node that much later through ``restart(name)``
    (which returns the new node object); ``nodes`` then holds the new object in the old
    one's place. ``on_crash(name, at_s)`` is told of every crash injected.
    """
    tasks = {asyncio.ensure_future(n.run()): n for n in nodes}
    by_name = {n.name: t for t, n in tasks.items()}
    crashed: list[str] = []

    # the job waits for a node that will be restarted through a stand-in future, settled
    # when the restarted node's task ends
    stand_in: dict[str, asyncio.Future[Any]] = {}

    def start_again(name: str) -> None:
        assert restart is not None
        node = restart(name)
        task = asyncio.ensure_future(node.run())
        tasks[task] = node
        by_name[name] = task
        nodes[[n.name for n in nodes].index(name)] = node
        fut = stand_in[name]

        def settle(t: asyncio.Task[Any]) -> None:
            if fut.done():
                return
            if t.cancelled():
                fut.cancel()
            elif t.exception() is not None:
                fut.set_exception(t.exception())  # type: ignore[arg-type]
            else:
                fut.set_result(None)
        task.add_done_callback(settle)

    def crash(name: str, at_s: float, restart_after_s: float = 0.0) -> None:
        task = by_name[name]
        if task.done() and name in stand_in and not stand_in[name].done():
            stand_in[name].set_result(None)  # it finished first: nothing to restart
        if not task.done():
            crashed.append(name)
            if on_crash is not None:
                on_crash(name, at_s)
            if name in stand_in:
                loop.call_at(at_s + restart_after_s, start_again, name)
            tasks[task].record("crash", fault="crash")
            task.cancel()
            asyncio.ensure_future(tasks[task].transport.close())

    loop = asyncio.get_running_loop()
    for f in faults:
        if f.kind == "crash":
            if f.duration_s > 0 and restart is not None and f.node not in stand_in:
                stand_in[f.node] = loop.create_future()
                tasks[stand_in[f.node]] = tasks[by_name[f.node]]  # (names a failure)
            loop.call_at(f.at_s, crash, f.node, f.at_s, f.duration_s)
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            order = {n.name: i for i, n in enumerate(nodes)}
            # deterministic: a root cause (not "another node failed") first, in plan order
            first = min(failed, key=lambda t: (isinstance(t.exception(), NodeFailure),
                                               order[tasks[t].name]))
            node = tasks[first]
            exc = first.exception()
            raise JobFailed(f"node {node.name} failed: {type(exc).__name__}: {exc}") from exc


def deadlock_hint(s: Scenario) -> str:
    """What in the scenario's faults may have left every node waiting (empty if none)."""
    crashes = [f.node for f in s.faults if f.kind == "crash"]
    links = ["-".join(f.link) for f in s.faults if f.kind == "link_down"]
    cut = [", ".join(f.dcs) for f in s.faults if f.kind == "partition"]
    hint = []
    if crashes:
        hint.append(f"the injected crash of {', '.join(crashes)} (turn on "
                    "membership.in_emulator to detect it by heartbeats)")
    if links:
        hint.append(f"the failed WAN link {', '.join(links)} (do the other links still "
                    "connect every DC?)")
    if cut:
        hint.append(f"the partition cutting off {'; '.join(cut)} (it never healed: give it a "
                    "duration)")
    return " after " + " and ".join(hint) if hint else ""
