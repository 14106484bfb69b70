"""``geomx.torch`` in a synchronous program (``def main(kv, ctx)``: ``opt.step()`` and the
broadcasts block): the event log is byte-identical to the ``async def`` twin's under
every sync algorithm, since the two forms differ only in how they wait
(geomx/torch/waits.py)."""

from __future__ import annotations

import pytest

from tests.torch.helpers import PROGRAM, run
from tests.torch.test_algorithms import CASES


def _log(r) -> bytes:
    return (r.run_dir / "events.jsonl").read_bytes()


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_a_sync_program_logs_as_its_async_twin(tmp_path, algorithm):
    sets, args, _ = CASES[algorithm]
    twin = run(tmp_path / "async", sets, args=args, iterations=8)
    sync = run(tmp_path / "sync", [*sets, f"training.program={PROGRAM}:sync_main"],
               program=False, args=args, iterations=8)
    assert _log(sync) == _log(twin)
    assert sync.summary.final_accuracy == twin.summary.final_accuracy


@pytest.mark.slow
def test_a_sync_program_trains_over_real_sockets(tmp_path):
    r = run(tmp_path, ["membership.heartbeat_timeout=60s",
                       f"training.program={PROGRAM}:sync_main"], program=False,
            iterations=12, runtime="real")
    assert r.summary.final_accuracy > 0.3
