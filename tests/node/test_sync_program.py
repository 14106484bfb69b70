"""Synchronous training programs: ``def main(kv, ctx)`` whose calls block, run on a thread
of their own that takes turns with the node's loop (geomx/node/program_thread.py).

In the emulator a sync program's event log is the same program's written ``async``, byte
for byte; over real sockets the loop runs beside the program's thread; misuse (an async-only
call in a sync program, a blocking call in an async one) fails in one line naming the
call to use; Ctrl-C while a call blocks leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import geomx.kv
from geomx.experiment import JobFailed, run_scenario
from geomx.node.program import ProgramError, load_program
from geomx.node.program_thread import ProgramThread, SyncCallError, run_blocking, run_on_loop
from geomx.scenario import load_scenario
from geomx.sim.loop import run_virtual

from tests.helpers.paths import EXAMPLES, QUICKSTART, ROOT
from tests.helpers.procs import sigint_as_from_a_terminal

SHORT = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=false"]


def _run(tmp_path, scenario, program, *sets, runtime="emu"):
    return run_scenario(load_scenario(scenario, [f"run.out_dir={tmp_path}", *SHORT,
                                                 f"training.program={program}", *sets]),
                        runtime=runtime, progress=False)


def _write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def _log(result):
    return (result.run_dir / "events.jsonl").read_bytes()


# ---------------------------------------------------------------- the same event log

@pytest.mark.parametrize("args", [[], ["--mixed-sync"]], ids=["fsa", "mixed-sync"])
def test_cnn_sync_example_writes_cnn_examples_event_log(tmp_path, args):
    """``--mixed-sync`` makes the store with ``geomx.kv.create("dist_async")`` in the program."""
    sets = ["run.iterations=8", "run.eval_every=4", f"training.program_args={args!r}"]
    sets[-1] = sets[-1].replace("'", '"')
    a = _run(tmp_path / "a", EXAMPLES / "cnn.toml", "cnn.py", *sets)
    s = _run(tmp_path / "s", EXAMPLES / "cnn.toml", "cnn_sync.py", *sets)
    assert _log(a) == _log(s)
    assert s.summary.iterations == 8 and s.summary.final_accuracy is not None


ASYNC_CALLS = """
import numpy as np
import geomx.kv

async def main(kv, ctx):
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker:
        kv.set_optimizer(ctx.optimizer_config)
    kv.init(list(range(len(params))), params)
    kv.init("extra", np.zeros(3, np.float32))
    if kv.is_master_worker:
        await kv.waitall()
        return {"where": "master"}
    for k, p in enumerate(params):
        kv.pull(k, out=p)
    await kv.waitall()
    await kv.barrier()
    data, batches = ctx.dataset(), ctx.batches()
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute(0.002 * (1 + ctx.worker_index))
        await ctx.compute("per_iter")
        for k, g in enumerate(grads):
            kv.pushpull(k, g, out=params[k], priority=-k)
        kv.push("extra", np.full(3, it, np.float32))
        extra = await kv.pull("extra")
        await kv.waitall()
        ctx.state["seen"] = float(np.asarray(extra).sum())
        if it % 3 == 0:
            await kv.barrier()
        ctx.report(it, loss=loss, now=ctx.now(), stop=ctx.stop_requested)
    return {"where": ctx.node_name}
"""

SYNC_CALLS = """
import numpy as np
import geomx.kv

def main(kv, ctx):
    assert geomx.kv.in_sync_program()
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker:
        kv.set_optimizer(ctx.optimizer_config)
    kv.init(list(range(len(params))), params)
    kv.init("extra", np.zeros(3, np.float32))
    if kv.is_master_worker:
        kv.waitall()
        return {"where": "master"}
    for k, p in enumerate(params):
        kv.pull(k, out=p)
    kv.waitall()
    kv.barrier()
    data, batches = ctx.dataset(), ctx.batches()
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        ctx.compute(0.002 * (1 + ctx.worker_index))
        ctx.compute("per_iter")
        for k, g in enumerate(grads):
            kv.pushpull(k, g, out=params[k], priority=-k)
        kv.push("extra", np.full(3, it, np.float32))
        extra = kv.pull("extra")
        kv.waitall()
        ctx.state["seen"] = float(np.asarray(extra).sum())
        if it % 3 == 0:
            kv.barrier()
        ctx.report(it, loss=loss, now=ctx.now(), stop=ctx.stop_requested)
    return {"where": ctx.node_name}
"""


def test_a_program_with_compute_barriers_and_value_pulls_logs_the_same_sync_or_async(tmp_path):
    a = _run(tmp_path / "a", QUICKSTART, _write(tmp_path, "calls_async.py", ASYNC_CALLS),
             "run.iterations=9")
    s = _run(tmp_path / "s", QUICKSTART, _write(tmp_path, "calls_sync.py", SYNC_CALLS),
             "run.iterations=9")
    assert _log(a) == _log(s)
    assert s.summary.iterations == 9
    # virtual time is exact: 9 iterations of compute 2 ms x (1 + index) + 10 ms at least
    assert s.summary.extra["final_eval"]["now"] > 9 * (0.002 + 0.010)


@pytest.mark.parametrize("sets", [
    ["sync.algorithm=hfa", "sync.k1=2", "sync.k2=2", "training.optimizer=none"],
    ["sync.algorithm=esync", "training.optimizer=none"],
    ["sync.algorithm=mixed"],
], ids=["hfa", "esync", "mixed"])
def test_worker_sync_steps_block_and_log_the_same(tmp_path, sets):
    """``ctx.worker_sync(...).step`` blocks; ESync's goodbye to the state server still
    comes when ``main`` returns."""
    pair = (ROOT / "tools" / "pair_program.py").read_text()
    sync_pair = (pair.replace("async def main", "def main").replace("await ", ""))
    sets = ["run.iterations=8", "training.worker_optimizer=adam", *sets]
    a = _run(tmp_path / "a", QUICKSTART, ROOT / "tools" / "pair_program.py", *sets)
    s = _run(tmp_path / "s", QUICKSTART, _write(tmp_path, "pair_sync.py", sync_pair), *sets)
    assert _log(a) == _log(s)
    assert s.summary.iterations == 8


# ---------------------------------------------------------------- the handoff itself

def test_in_the_emulator_the_loop_stands_still_while_the_thread_runs():
    """Exactly one thread runs at a time: a callback due now runs only once the program
    blocks, and virtual time moves only in the calls it waits on."""
    seen: list[str] = []

    def program() -> float:
        seen.append("thread starts")
        time.sleep(0.05)  # wall time the loop must not see
        seen.append("thread computed")
        run_blocking(asyncio.sleep, 1.5)
        seen.append(f"thread after sleep at {asyncio_now()}")
        return run_on_loop(lambda: asyncio.get_running_loop().time())

    loop_ref: list[asyncio.AbstractEventLoop] = []

    def asyncio_now() -> float:
        return run_on_loop(lambda: loop_ref[0].time())

    async def job() -> float:
        loop = asyncio.get_running_loop()
        loop_ref.append(loop)
        loop.call_soon(seen.append, "callback")
        return await ProgramThread(loop, "p").run(program)

    assert run_virtual(job()) == 1.5
    assert seen == ["thread starts", "thread computed", "callback", "thread after sleep at 1.5"]


def test_over_a_wall_clock_loop_the_loop_runs_beside_the_thread():
    """The program thread waits (outside geomx) for something only the loop does: it
    returns only because the loop kept running beside it."""
    ticked = threading.Event()

    def program() -> bool:
        return ticked.wait(60)

    async def ticker() -> None:
        for _ in range(3):
            await asyncio.sleep(0.01)
        ticked.set()

    async def job() -> bool:
        task = asyncio.ensure_future(ticker())
        try:
            return await ProgramThread(asyncio.get_running_loop(), "p").run(program)
        finally:
            task.cancel()

    assert asyncio.run(job()) is True


@pytest.mark.parametrize("runner", ["virtual", "asyncio"])
def test_an_error_on_the_loop_is_raised_in_the_program_and_the_program_goes_on(runner):
    def fails() -> None:
        raise ValueError("no such key")

    def program() -> str:
        try:
            run_on_loop(fails)
        except ValueError as e:
            return f"caught {e} then {run_blocking(asyncio.sleep, 0, 'slept')}"
        return "not raised"

    async def job() -> str:
        return await ProgramThread(asyncio.get_running_loop(), "p").run(program)

    assert (run_virtual if runner == "virtual" else asyncio.run)(job()) == \
        "caught no such key then slept"


@pytest.mark.parametrize("runner", ["virtual", "asyncio"])
def test_a_cancelled_program_unwinds_its_thread(runner):
    unwound = threading.Event()

    def program() -> None:
        try:
            run_blocking(asyncio.sleep, 3600)
        finally:
            unwound.set()

    async def job() -> None:
        task = asyncio.ensure_future(ProgramThread(asyncio.get_running_loop(), "p").run(program))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    (run_virtual if runner == "virtual" else asyncio.run)(job())
    assert unwound.wait(10)


def test_a_failing_sync_program_fails_its_job_like_an_async_one_and_leaves_no_thread(tmp_path):
    program = _write(tmp_path, "fails.py", """
        def main(kv, ctx):
            params = ctx.build_model().params
            kv.init(list(range(len(params))), params)
            kv.waitall()
            if kv.is_master_worker:
                return
            for it in ctx.iterations():
                ctx.compute()
                if ctx.worker_index == 2 and it == 3:
                    raise ValueError("bad batch")
                kv.barrier()
        """)
    before = threading.active_count()
    with pytest.raises(JobFailed) as info:
        _run(tmp_path, QUICKSTART, program, "run.iterations=10")
    message = str(info.value)
    assert "raised on node w:party-b:0: ValueError: bad batch" in message
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before


# ---------------------------------------------------------------- bad input

def test_await_in_a_plain_def_names_both_forms(tmp_path):
    path = _write(tmp_path, "awaits.py", """
        def main(kv, ctx):
            await kv.waitall()
        """)
    with pytest.raises(ProgramError) as info:
        load_program(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert "line 3" in message and "kv.waitall()" in message and "async def main" in message


def test_a_generator_is_not_a_program(tmp_path):
    path = _write(tmp_path, "gen.py", """
        def main(kv, ctx):
            yield 1
        """)
    with pytest.raises(ProgramError, match="must be a function, `def main"):
        load_program(str(path))


@pytest.mark.parametrize("body, expected", [
    ("ctx.finish_sync()", "ctx.finish_sync() is for `async def main`"),
    ("ctx.worker_sync(kv, []).finish()", "sync.finish() is called by geomx"),
    ("return kv.async_store.waitall()", "returned a coroutine; write `async def main"),
    ("t = threading.Thread(target=lambda: errors.append(_try(kv.waitall))); t.start(); "
     "t.join(); raise errors[0]", "kv.waitall() blocks, so only a synchronous program"),
])
def test_an_async_only_call_in_a_sync_program_names_the_call_to_use(tmp_path, body, expected):
    program = _write(tmp_path, "misuse.py", f"""
        import threading
        errors = []

        def _try(fn):
            try:
                fn()
            except Exception as e:
                return e

        def main(kv, ctx):
            {body}
        """)
    with pytest.raises(JobFailed) as info:
        _run(tmp_path, QUICKSTART, program, "run.iterations=2")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("body, expected", [
    ("geomx.kv.SyncKVStore(kv).waitall()",
     "kv.waitall() blocks, so only a synchronous program (`def main(kv, ctx)`) may call it, "
     "from its own thread; in `async def main` write `await kv.waitall()`"),
    ("geomx.kv.SyncKVStore(kv).push(0, 1.0)", "in `async def main` write `kv.push(...)`"),
])
def test_a_blocking_call_in_an_async_program_names_the_await_form(tmp_path, body, expected):
    program = _write(tmp_path, "misuse_async.py", f"""
        import geomx.kv

        async def main(kv, ctx):
            assert not geomx.kv.in_sync_program()
            {body}
        """)
    with pytest.raises(JobFailed) as info:
        _run(tmp_path, QUICKSTART, program, "run.iterations=2")
    assert expected in str(info.value)


def test_blocking_calls_outside_any_program_are_refused():
    assert not geomx.kv.in_sync_program()
    with pytest.raises(SyncCallError, match="only a synchronous program"):
        run_blocking(asyncio.sleep, 0, call="sleep", async_form="await asyncio.sleep(0)")


# ---------------------------------------------------------------- real sockets

@pytest.mark.slow
def test_a_sync_program_trains_over_real_sockets_as_in_the_emulator(tmp_path):
    sets = ["run.iterations=20", "run.eval_every=5"]
    emu = _run(tmp_path / "emu", EXAMPLES / "cnn.toml", "cnn_sync.py", *sets)
    real = _run(tmp_path / "real", EXAMPLES / "cnn.toml", "cnn_sync.py", *sets,
                runtime="real")
    assert real.summary.iterations == 20
    assert real.summary.final_accuracy == pytest.approx(emu.summary.final_accuracy, abs=1e-9)


BLOCKED_FOREVER = """
def main(kv, ctx):
    params = ctx.build_model().params
    kv.init(list(range(len(params))), params)
    kv.waitall()
    if kv.is_master_worker:
        return
    if ctx.worker_index == 0:
        ctx.compute(3600)   # blocked in a call for an hour
    kv.barrier()            # its DC's other worker waits for it
"""


@pytest.mark.slow
def test_ctrl_c_while_a_sync_program_blocks_exits_130_and_leaves_no_process(tmp_path):
    program = _write(tmp_path, "blocked.py", BLOCKED_FOREVER)
    out = tmp_path / "runs"
    p = subprocess.Popen([sys.executable, "-m", "geomx", "run", str(QUICKSTART),
                          "--runtime", "real", "--quiet", "--out", str(out),
                          "--program", str(program), "--set", "run.target_accuracy=0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         preexec_fn=sigint_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _blocked(out):
            time.sleep(0.2)  # the job is starting
        assert _blocked(out), "the programs never reached their blocking calls"
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, err
    assert "geomx: interrupted" in err and "Traceback" not in err, err
    left = subprocess.run(["pgrep", "-f", f"geomx node .*{out}"], capture_output=True,
                          text=True).stdout.split()
    assert left == [], left


def _blocked(out) -> bool:
    """party-b's workers are through their barrier, so party-a's have reached theirs:
    w:party-a:0 sleeps in ``ctx.compute(3600)``, w:party-a:1 waits in ``kv.barrier()``."""
    return len(list(out.glob("*/nodes/w_party-b_*.result.json"))) == 2


NODES = ["gh", "lh:party-a", "lh:party-b", "gs:0", "ls:party-a", "ls:party-b", "mw",
         "w:party-a:0", "w:party-a:1", "w:party-b:0", "w:party-b:1"]


def _start_by_hand(tmp_path, program, *sets):
    """Every node of the quickstart job as its own ``geomx node`` process, as on many hosts
    (docs/real-runtime.md); SIGINT reaches each as from its terminal."""
    from tests.helpers.ports import free_port_block

    scenario = tmp_path / "job.toml"
    scenario.write_text(QUICKSTART.read_text()
                        + f"\n[real]\nport_base = {free_port_block(4)}\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GEOMX_START_EPOCH": repr(time.time()),
           "GEOMX_RUN_DIR": str(tmp_path / "run"), "GEOMX_SECRET": "by-hand",
           "PYTHONPATH": str(ROOT)}
    sets = [x for s in ("run.target_accuracy=0", "metrics.plot=false",
                        f"training.program={program}", *sets) for x in ("--set", s)]
    procs = {}
    for name in NODES:
        log = open(tmp_path / f"{name.replace(':', '_')}.log", "w")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "geomx", "node", str(tmp_path / "job.toml"), "--name", name,
             *sets], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=sigint_as_from_a_terminal)
    return procs


def _kill_all(procs):
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.slow
def test_a_sync_program_in_a_job_started_node_by_node(tmp_path):
    """``geomx node`` per node: each node runs the sync program the same way."""
    program = _write(tmp_path, "by_hand.py", f"""
        import sys
        sys.path.insert(0, {str(EXAMPLES)!r})
        import geomx.kv
        import cnn_sync

        def main(kv, ctx):
            cnn_sync.main(kv, ctx)
            return {{"on_program_thread": geomx.kv.in_sync_program()}}
        """)
    procs = _start_by_hand(tmp_path, program, "run.iterations=10")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(0.2)
        codes = {n: p.poll() for n, p in procs.items()}
    finally:
        _kill_all(procs)
    logs = {n: (tmp_path / f"{n.replace(':', '_')}.log").read_text()[-1500:]
            for n, c in codes.items() if c != 0}
    assert all(c == 0 for c in codes.values()), (codes, logs)
    evaluator = json.loads((tmp_path / "run" / "nodes" / "w_party-a_0.result.json").read_text())
    assert evaluator["iterations"] == 10 and evaluator["result"]["accuracy"] > 0.3
    assert evaluator["result"]["on_program_thread"] is True


@pytest.mark.slow
def test_ctrl_c_to_a_node_started_by_hand_while_its_program_blocks_exits_130(tmp_path):
    procs = _start_by_hand(tmp_path, _write(tmp_path, "blocked.py", BLOCKED_FOREVER))
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _blocked(tmp_path):
            time.sleep(0.2)
        assert _blocked(tmp_path), "the programs never reached their calls"
        time.sleep(1.0)
        worker = procs["w:party-a:0"]  # in ctx.compute(3600)
        worker.send_signal(signal.SIGINT)
        code = worker.wait(30)
    finally:
        _kill_all(procs)
    assert code == 130, (tmp_path / "w_party-a_0.log").read_text()[-1500:]
    assert "Traceback" not in (tmp_path / "w_party-a_0.log").read_text()


@pytest.mark.slow
def test_a_sync_program_with_state_resumes_bit_exact(tmp_path):
    """Checkpoints are taken in ``ctx.iterations()`` on the node's loop, between two of the
    program's calls: a stopped and resumed sync program ends with the uninterrupted model."""
    import numpy as np

    from tests.node.test_program_checkpoint import CNN, STATEFUL, _stop_and_resume

    program = _write(tmp_path, "noisy_sync.py",
                     STATEFUL.replace("async def main", "def main").replace("await ", ""))
    scenario = tmp_path / "noisy.toml"
    scenario.write_text(CNN.read_text().replace('program = "cnn.py"', f'program = "{program}"'))
    clean, resumed, first, second = _stop_and_resume(
        scenario, ["checkpoint.every=5"], stop=15, end=25, out=tmp_path / "runs")
    for name in clean:
        for a, b in zip(clean[name], resumed[name]):
            assert np.array_equal(a, b)
    assert second.summary.iterations == 25


@pytest.mark.slow
def test_ctrl_c_in_the_emulator_while_a_sync_program_computes_exits_130(tmp_path):
    """The loop waits for the program's thread, with the clock stopped: Ctrl-C there
    still ends the run (at once, no other node's program started)."""
    marker = tmp_path / "computing"
    program = _write(tmp_path, "sleeps.py", f"""
        import pathlib
        import time

        def main(kv, ctx):
            if not kv.is_master_worker:
                pathlib.Path({str(marker)!r}).touch()
                time.sleep(3600)   # the program's own work, an hour of it
        """)
    p = subprocess.Popen([sys.executable, "-m", "geomx", "run", str(QUICKSTART), "--quiet",
                          "--out", str(tmp_path / "runs"), "--program", str(program)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         preexec_fn=sigint_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not marker.exists():
            time.sleep(0.1)
        assert marker.exists(), "the program never started"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, err
    assert "geomx: interrupted" in err


def test_library_code_reaches_the_loop_from_a_sync_program(tmp_path):
    """``geomx.kv.run_blocking`` awaits a coroutine of its own on the node's loop (here a
    virtual half second); ``run_on_loop`` makes a plain call there."""
    program = _write(tmp_path, "library.py", """
        import asyncio
        import geomx.kv

        def main(kv, ctx):
            t0 = ctx.now()
            geomx.kv.run_blocking(asyncio.sleep, 0.5)
            loop_time = geomx.kv.run_on_loop(lambda: asyncio.get_running_loop().time())
            return {"slept_s": ctx.now() - t0, "same_clock": loop_time == ctx.now()}
        """)
    r = _run(tmp_path, QUICKSTART, program, "run.iterations=1")
    final = r.summary.extra["final_eval"]
    assert final["slept_s"] == 0.5 and final["same_clock"] is True


def test_the_sync_store_and_context_offer_every_public_call_of_the_async_ones():
    """The contract library code (geomx.torch) relies on: a sync program's ``kv`` and
    ``ctx`` have the async ones' public names, and none of their calls is a coroutine."""
    from geomx.node.kvstore import KVStore
    from geomx.node.program import ProgramContext
    from geomx.node.sync_program import SyncKVStore, SyncProgramContext

    node_internal = {"declare_keys"}  # the node calls it on the async store it registered
    public = {n for n in dir(KVStore) if not n.startswith("_")} - node_internal
    assert public <= set(dir(SyncKVStore))
    assert not [n for n in public if asyncio.iscoroutinefunction(getattr(SyncKVStore, n))]
    overridden = {n for n in vars(SyncProgramContext) if not n.startswith("_")}
    async_calls = {n for n in dir(ProgramContext) if not n.startswith("_")
                   and asyncio.iscoroutinefunction(getattr(ProgramContext, n))}
    assert async_calls <= overridden  # compute blocks, finish_sync is refused by name
    assert not [n for n in overridden
                if asyncio.iscoroutinefunction(getattr(SyncProgramContext, n))]
