"""A node decodes a built-in codec's payload by its name alone, whatever it has imported.

The compressing codecs' modules are imported on first use (they import Numba), and a
decoder is registered when its module is imported; a local server can get an fp16 pull
reply or push before the master's ``set_gradient_compression`` reaches it (a resumed
``geomx.torch`` job over real sockets did: ``unknown codec 'fp16' in meta; known:
['none']``). Each check runs in a fresh interpreter, so no other test has imported the
codec first.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from geomx.policy.codec import _DECODERS

from tests.helpers.paths import ROOT


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


#: fp16 payload of a (2, 3) float32 tensor, built by hand (no codec module imported)
_FP16 = """
    import sys
    import numpy as np

    x = np.array([[0.5, -1.25, 3.0], [1e-3, 7.0, -2.0]], np.float32)
    half = x.astype(np.float16).reshape(-1)
    meta = {"codec": "fp16", "n": 6, "dtype": "<f4", "shape": [2, 3]}
    want = half.astype(np.float32).reshape(2, 3)
"""


@pytest.mark.parametrize("decode_it", [
    # what a local server runs on a pull reply or push while its link codec is dense
    """
    from geomx.node.link_codec import LinkCodec
    from geomx.wire import Kind, Message, Payload
    assert "geomx.codec.fp16" not in sys.modules
    msg = Message(Kind.PULL_REPLY, "gs:0", "ls:east", key=3, payloads=[Payload.of(half)],
                  meta=meta)
    y = LinkCodec(None).decode(msg, like=np.zeros((2, 3), np.float32))
    """,
    # the codec protocol alone (geomx.codec not imported at all)
    """
    from geomx.policy.codec import decode
    assert "geomx.codec" not in sys.modules
    y = decode(([half], meta))
    """], ids=["link-codec", "protocol"])
def test_a_node_decodes_fp16_before_it_is_told_the_codec(decode_it):
    r = _python(textwrap.dedent(_FP16) + textwrap.dedent(decode_it) + """
assert y.dtype == np.float32 and np.array_equal(y, want), y
print("ok")
""")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_an_unknown_codec_is_still_refused_naming_every_known_one():
    r = _python("""
        import numpy as np
        from geomx.node.link_codec import LinkCodec
        from geomx.policy.codec import CodecError, decode
        from geomx.wire import Kind, Message, Payload

        meta = {"codec": "zstd", "n": 4, "dtype": "<f4", "shape": [4]}
        try:
            decode(([np.zeros(4, np.float16)], meta))
        except CodecError as e:
            print(e)
        msg = Message(Kind.PUSH, "w:east:0", "ls:east", key=1,
                      payloads=[Payload.of(np.zeros(4, np.float16))], meta=meta)
        try:
            LinkCodec(None).decode(msg)
        except ValueError as e:
            print(e)
    """)
    assert r.returncode == 0, r.stderr
    known = "known: ['bf16', 'bsc', 'fp16', 'none', 'onebit']"  # mpq is a policy, no decoder
    assert r.stdout.splitlines() == [
        f"unknown codec 'zstd' in meta; {known}",
        f"cannot decode 'zstd' payload: unknown codec 'zstd' in meta; {known}"], r.stdout


def test_a_user_codec_cannot_take_a_built_in_name_not_imported_yet():
    """A class named like a built-in codec never becomes its decoder, also when it is
    defined before the built-in's module is imported (the registry refuses such a user
    codec; its class must not linger as the decoder either)."""
    r = _python("""
        import sys
        import numpy as np
        from geomx.policy.codec import Codec, decode

        class Impostor(Codec):
            name = "fp16"
            def encode(self, key, x, state=None): raise AssertionError
            def encoded_sizes(self, n, dtype="<f4"): return []
            @classmethod
            def _decode_cpu(cls, *a): raise AssertionError("the impostor decoded")

        class Mine(Codec):
            name = "mine"
            def encode(self, key, x, state=None): raise AssertionError
            def encoded_sizes(self, n, dtype="<f4"): return []
            @classmethod
            def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):
                return np.full(n, 9.0, dtype)

        assert "geomx.codec.fp16" not in sys.modules
        y = decode(([np.ones(2, np.float16)], {"codec": "fp16", "n": 2, "dtype": "<f4"}))
        assert y.tolist() == [1.0, 1.0]
        z = decode(([], {"codec": "mine", "n": 2, "dtype": "<f4"}))
        assert z.tolist() == [9.0, 9.0]
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_loader_knows_exactly_the_built_in_decoders():
    """The loader's names are the names the built-in codec modules register."""
    from geomx.codec import registry

    for name in registry.CODEC_NAMES:
        registry.codec_class(name)  # imports every built-in codec module
    builtin = {n for n, cls in _DECODERS.items() if cls.__module__.startswith("geomx.codec.")}
    assert builtin == set(registry.DECODER_NAMES)
    for name in registry.DECODER_NAMES:
        assert _DECODERS[name].__module__ == f"geomx.codec.{registry._DECODER_MODULES[name]}"
