"""Horovod's ``compression=`` names on geomx's codecs (geomx/codec, docs/geomx-behaviour.md §4).

Horovod compresses each allreduce in the worker; geomx compresses on the links the
scenario's codec covers, configured once for the whole job by the master worker
(``kv.set_gradient_compression``), so ``compression=`` selects the job's codec:
``Compression.none`` keeps the scenario's ``[codec]`` (none unless it names one),
``Compression.fp16`` is geomx's ``fp16``. geomx's own codec names (``bf16``, ``bsc``,
``mpq``, ``onebit``) and config dicts are taken too.
"""

from __future__ import annotations

from typing import Any

from geomx.codec import CODEC_NAMES


class Compression:
    """Horovod's ``hvd.Compression`` names."""

    none = "none"
    fp16 = "fp16"


def codec_config(compression: Any) -> dict[str, Any] | None:
    """The codec config ``compression`` stands for; None: the scenario's codec stands."""
    if compression is None or compression == Compression.none:
        return None
    if isinstance(compression, dict):
        if compression.get("type") not in CODEC_NAMES:
            raise ValueError(f"compression={compression!r}: 'type' must be one of "
                             f"{', '.join(CODEC_NAMES)}")
        return dict(compression)
    if isinstance(compression, str) and compression in CODEC_NAMES:
        return {"type": compression}
    raise ValueError(f"compression={compression!r}; allowed: Compression.none, "
                     f"Compression.fp16, or a geomx codec name ({', '.join(CODEC_NAMES)}) "
                     "or config dict")
