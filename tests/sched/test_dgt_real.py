"""DGT over real sockets (one process per node, loopback, the transport's shaper).

The UDP mode runs its bands as datagrams through the shaper's loss; it must finish with
the emulator's accuracy +- 0.02 (the same scenario and seed). The reliable (tcp) mode
must deliver every band block (on time or a round late).
"""


import pytest

from geomx.experiment import run_scenario

from tests.helpers.events import run_events

SHORT = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")


@pytest.mark.slow
def test_udp_mode_with_shaper_loss_matches_the_emulator(scenario_of):
    args = ("run.iterations=30", "sched.dgt=udp", "wan.0.loss=1%", "wan.1.loss=1%", *SHORT)
    real = run_scenario(scenario_of("dgt.toml", *args), runtime="real")
    emu = run_scenario(scenario_of("dgt.toml", *args), runtime="emu")
    assert real.summary.iterations == emu.summary.iterations == 30
    assert abs(real.summary.final_accuracy - emu.summary.final_accuracy) <= 0.02
    d = real.summary.extra["dgt"]
    assert d["bands"][0]["dropped"] == 0
    assert sum(b["sent_blocks"] for b in d["bands"][1:]) > 0
    events = run_events(real.run_dir)
    # the bands really went as datagrams (unreliable channels 9..11)
    chans = {e["channel"] for e in events if e["ev"] == "send" and e.get("msg") == "PUSH"
             and e["src"].startswith("ls:")}
    assert {9, 10, 11} <= chans


@pytest.mark.slow
def test_tcp_mode_over_sockets_delivers_every_band_block(scenario_of):
    r = run_scenario(scenario_of("dgt.toml", "run.iterations=12", "sched.dgt=tcp", *SHORT),
                     runtime="real")
    assert r.summary.iterations == 12 and r.summary.final_accuracy is not None
    d = r.summary.extra["dgt"]
    assert d["bands"][1]["sent_blocks"] > 0
    for b in d["bands"]:
        assert b["dropped"] == 0 or b["band"] > 0  # channel 0 never loses a block
        assert b["on_time"] + b["late"] + b["dropped"] == b["sent_blocks"]


def test_udp_bands_are_marked_below_best_effort_without_iptables():
    """DGT's bands leave with ToS CS1 (band 1) / LE (bands 2..), set per datagram."""
    import asyncio
    import socket

    import numpy as np

    from geomx.runtime.framing import RejectLog
    from geomx.runtime.udp import TOS_CS1, TOS_LE, UdpEndpoint, tos_of_channel
    from geomx.wire import Kind, Message, Payload

    assert [tos_of_channel(c) for c in (0, 8, 9, 10, 15)] == [0, 0, TOS_CS1, TOS_LE, TOS_LE]

    async def run():
        got: list[Message] = []
        rx = UdpEndpoint("b", on_message=lambda m, n: got.append(m), rejects=RejectLog("b"))
        tx = UdpEndpoint("a", on_message=lambda m, n: None, rejects=RejectLog("a"))
        port = await rx.start("127.0.0.1", 0)
        await tx.start("127.0.0.1", 0)
        sock = tx._transport.get_extra_info("socket")
        seen = []
        try:
            for ch in (9, 10, 8):
                msg = Message(Kind.PUSH, "a", "b", channel=ch,
                              payloads=[Payload.of(np.ones(2000, np.float32))])  # 6 datagrams
                await tx.send(msg, ("127.0.0.1", port))
                seen.append(sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS))
            for _ in range(100):
                if len(got) == 3:
                    break
                await asyncio.sleep(0.01)
        finally:
            tx.close()
            rx.close()
        return seen, got, tx.stats()

    seen, got, stats = asyncio.run(run())
    assert [m.channel for m in got] == [9, 10, 8]
    if stats["tos_refused"]:
        # an OS that refuses the marking: datagrams still go, unmarked, and it is counted
        assert seen == [0, 0, 0]
    else:
        assert seen == [TOS_CS1, TOS_LE, 0]
        assert stats["tos_marked"] == 12
