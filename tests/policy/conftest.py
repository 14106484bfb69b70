"""Shared fixtures of the policy tests: the example policies' paths and a folder of
user policy files written per test."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

EXAMPLES = ROOT / "examples" / "policies"
DGC_SPEC = f"{EXAMPLES / 'dgc.py'}:DeepGradientCompression"
SSP_SPEC = f"{EXAMPLES / 'ssp.py'}:BoundedStaleness"

#: A user codec: dense, but raising in encode after ``after`` calls (a bug in a round).
BOOM_CODEC = '''
import numpy as np
from geomx.policy import Codec
from geomx.policy.codec import ArraySpec, encode_dense


class Boom(Codec):
    name = "test-boom"
    params = ("after",)

    def __init__(self, after: int = 3):
        self.after = after
        self.calls = 0

    def encode(self, key, x, state=None):
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError("top-k buffer overflow")
        return encode_dense(x)

    def encoded_sizes(self, n, dtype="<f4"):
        return [ArraySpec(np.dtype(dtype).str, (n,))]

    @classmethod
    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):
        return arrays[0]


class NoEncode(Codec):
    name = "test-noencode"

    def encoded_sizes(self, n, dtype="<f4"):
        return []

    @classmethod
    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):
        return arrays[0]


class NotACodec:
    pass
'''


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    """A folder holding ``boom.py`` (the codecs above) and ``broken.py`` (does not import)."""
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "boom.py").write_text(textwrap.dedent(BOOM_CODEC))
    (folder / "broken.py").write_text("import a_module_that_is_not_installed\n")
    return folder
