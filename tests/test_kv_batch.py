"""A list push/pull through ``geomx.kv`` travels as one BATCH per server, in
both runtimes, with the same values as the same keys one by one; and the BATCH frame
round-trips through the wire format and refuses what it must not carry."""

import textwrap
from collections import Counter

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.metrics.recorder import iter_events
from geomx.scenario import load_scenario
from geomx.wire import Kind, Message, Payload, WireError, decode, encode_bytes

from tests.helpers.paths import ROOT


PROGRAM = """
import numpy as np

async def main(kv, ctx):
    keys = [0, 1, 2]
    vals = [np.zeros(3, np.float32), np.zeros(5, np.float32), np.zeros(2, np.float32)]
    if kv.is_master_worker:
        kv.set_optimizer({"name": "SGD", "learning_rate": 1.0, "rescale_grad": 1.0})
        kv.init(keys, vals)
        await kv.waitall()
        return
    kv.init(keys, vals)
    kv.push(keys, [np.ones_like(v) for v in vals])            # one BATCH
    outs = [np.empty_like(v) for v in vals]
    got = await kv.pull(keys, out=outs)                        # one BATCH
    assert got is not None and all(g is o for g, o in zip(got, outs))
    # SGD lr 1 on the sum of 4 workers' pushes of 1 -> -4
    assert all(np.allclose(o, -4.0) for o in outs), outs
    fresh = await kv.pull(keys)                                # no out: new arrays
    assert [f.shape for f in fresh] == [(3,), (5,), (2,)]
    for k in keys:                                             # one message per key
        kv.push(k, np.ones_like(vals[k]))
    one = [await kv.pull(k) for k in keys]
    assert all(np.allclose(o, -8.0) for o in one), one
    ctx.report(1, loss=0.0, accuracy=1.0)
"""


def _run(tmp_path, runtime):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    s = load_scenario(ROOT / "examples" / "cnn.toml",
                      [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false",
                       f"training.program={prog}", "run.iterations=3"])
    return run_scenario(s, runtime=runtime)


def _sends(run_dir, node):
    return Counter(e["msg"] for e in iter_events(run_dir / "events.jsonl")
                   if e["ev"] in ("send", "xfer") and e["node"] == node)


@pytest.mark.slow
def test_list_calls_are_one_message_per_server_in_the_emulator(tmp_path):
    r = _run(tmp_path, "emu")
    assert r.summary.final_accuracy == 1.0  # every assertion in the program held
    sent = _sends(r.run_dir, "w:party-a:0")
    # list push, list pull, list pull without out: 3 BATCHes to the DC's one local
    # server; the per-key calls: 3 PUSH and 3 PULL
    assert sent["BATCH"] == 3 and sent["PUSH"] == 3 and sent["PULL"] == 3, sent
    # the pulls of a list, answered at once (the round is done), come back as one BATCH
    assert _sends(r.run_dir, "ls:party-a")["BATCH"] >= 2


@pytest.mark.slow
def test_list_calls_are_one_message_per_server_over_sockets(tmp_path):
    r = _run(tmp_path, "real")
    assert r.summary.final_accuracy == 1.0
    sent = _sends(r.run_dir, "w:party-a:0")
    assert sent["BATCH"] == 3 and sent["PUSH"] == 3 and sent["PULL"] == 3, sent


def _batch():
    subs = [Message(Kind.PUSH, "w", "s", key=k, request_id=k + 1, meta={"k": k},
                    payloads=[Payload.of(np.full(k + 1, k, np.float32))]) for k in range(3)]
    subs.append(Message(Kind.PULL, "w", "s", key=7, request_id=9))
    return Message(Kind.BATCH, "w", "s", batch=subs)


def test_batch_round_trips_with_zero_copy_payloads():
    m = _batch()
    d = decode(encode_bytes(m))
    assert d.kind == Kind.BATCH and (d.src, d.dst) == ("w", "s")
    assert [(s.kind, s.key, s.request_id, s.meta) for s in d.batch] == \
        [(s.kind, s.key, s.request_id, s.meta) for s in m.batch]
    for s, t in zip(d.batch[:3], m.batch[:3]):
        assert np.array_equal(s.payloads[0].data, t.payloads[0].data)
    assert m.nbytes > sum(s.nbytes for s in m.batch)


def test_batch_refuses_what_it_must_not_carry():
    m = _batch()
    raw = encode_bytes(m)
    for cut in (len(raw) - 1, len(raw) // 2, 60):
        with pytest.raises(WireError):
            decode(raw[:cut])
    with pytest.raises(WireError, match="trailing"):
        decode(raw + b"\0")
    stranger = Message(Kind.PULL, "x", "s", key=1)
    with pytest.raises(WireError, match="own src and dst"):
        encode_bytes(Message(Kind.BATCH, "w", "s", batch=[stranger]))
    with pytest.raises(WireError, match="own src and dst"):
        encode_bytes(Message(Kind.BATCH, "w", "s", batch=[m]))
    with pytest.raises(WireError, match="1.."):
        encode_bytes(Message(Kind.BATCH, "w", "s", batch=[]))
