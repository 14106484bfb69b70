"""The example programs that step their own model resume where they stopped.

``examples/cnn_bsc.py``, ``cnn_fp16.py`` and ``cnn_mpq.py`` run no global optimizer (the
servers sum the gradients, each worker takes a local Adam step) and ``cnn_hfa.py`` steps
locally between model averages. On ``--resume`` a pull after ``kv.init`` gives such a
program the servers' last sum, not its model, so the examples keep their model and Adam
moments in ``ctx.state`` (``examples/common.py: keep_local_model``). A run stopped at a
checkpoint and resumed must end where the uninterrupted run ends: the same final
accuracy and loss (without ``ctx.state``, cnn_bsc stopped at 20 of 40 iterations
ended at 0.26 instead of 0.87).
"""

from __future__ import annotations

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.resume import straight_and_resumed

QUIET = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=false"]

#: (example, runtime, checkpoint every, stop, end): HFA's checkpoint rounds are global
#: syncs, every k1 * k2 = 20 iterations
CASES = [
    ("cnn_bsc", "emu", 5, 10, 20),
    ("cnn_bsc", "real", 5, 10, 20),
    ("cnn_fp16", "emu", 5, 10, 20),
    ("cnn_hfa", "emu", 1, 20, 60),
]


@pytest.mark.slow
@pytest.mark.parametrize("example, runtime, every, stop, end", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_an_example_that_steps_locally_resumes_where_it_stopped(tmp_path, example, runtime,
                                                               every, stop, end):
    clean, resumed = straight_and_resumed(ROOT / "examples" / f"{example}.toml",
                                          [*QUIET, f"checkpoint.every={every}"],
                                          runtime=runtime, stop=stop, end=end,
                                          out=tmp_path / "runs")
    assert resumed.summary.extra["resumed_from"]["checkpoint"].endswith(f"/{stop if every > 1 else 1}")
    assert resumed.summary.iterations == clean.summary.iterations == end
    assert clean.summary.final_accuracy > 0.6  # chance: 0.1
    assert resumed.summary.final_accuracy == clean.summary.final_accuracy
    assert resumed.summary.final_loss == pytest.approx(clean.summary.final_loss, rel=1e-6)
