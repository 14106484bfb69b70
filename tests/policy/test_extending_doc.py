"""The complete codec of docs/extending.md ("A codec") works as written: a reader who
copies it gets a codec that trains and sends fewer WAN bytes than dense values."""

from __future__ import annotations

import re
from pathlib import Path

from geomx.testing import run_policy

from tests.helpers.paths import ROOT


def _codec_block() -> str:
    text = (ROOT / "docs" / "extending.md").read_text()
    section = text[text.index("## A codec"):text.index("## A sync algorithm")]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return block


def test_the_documented_codec_trains_and_saves_wan_bytes(tmp_path: Path) -> None:
    path = tmp_path / "q8.py"
    path.write_text(_codec_block())
    q8 = run_policy(f"{path}:Q8", {"min_size": 100}, kind="codec", iterations=15)
    dense = run_policy(f"{path}:Q8", {"min_size": 10**9}, kind="codec", iterations=15)
    assert q8.summary.final_accuracy > 0.4  # 15 iterations: about 0.53, chance is 0.1
    assert q8.summary.bytes_wan < 0.85 * dense.summary.bytes_wan
