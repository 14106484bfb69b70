"""Finding a policy class by the name a scenario gives it.

A scenario names a policy the way it names a training program (``[training] program``):

* a **built-in name** (``"fsa"``, ``"bsc"``, ``"netstorm"``): the rows of :data:`BUILTIN`,
  each a ``module:Class`` string imported on first use (so a job pays only for the
  policies it runs, and the node layer never imports a concrete policy module);
* a **file** next to the scenario, ``"lab/ssp.py:BoundedStaleness"`` (the scenario loader
  makes the path absolute, so every node of a job finds the same file);
* an **importable module**, ``"lab.ssp:BoundedStaleness"``;
* an **installed plug-in**: a name in the ``geomx.policies`` entry-point group
  (``[project.entry-points."geomx.policies"] ssp = "lab.ssp:BoundedStaleness"``).

:func:`policy_class` returns the class and checks that it is a policy of the asked
kind with every abstract method written; every failure is a :class:`PolicyError` of one
line naming the policy. ps-lite plugs application behaviour into a fixed transport the
same way (``KVServer::set_request_handle``); Flower users pass a ``Strategy`` instance.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import zlib
from typing import Any

__all__ = ["KINDS", "BUILTIN", "PolicyError", "policy_class", "is_builtin", "builtin_names",
           "describe_spec", "ENTRY_POINT_GROUP", "entry_point_names", "spec_of",
           "dense_codec", "import_file", "import_name"]

#: The kinds of policy a scenario can name, and where: ``[sync] algorithm``,
#: ``[sched] policy``, ``[topology] kind``, ``[codec] type``.
KINDS = ("sync", "sched", "topology", "codec")

ENTRY_POINT_GROUP = "geomx.policies"

#: kind -> built-in name -> ``module:Class``. The classes are plug-ins of this package's
#: API like any user's; the names are what the scenario documentation lists.
BUILTIN: dict[str, dict[str, str]] = {
    "sync": {
        "fsa": "geomx.sync.fsa:FSA",
        "mixed": "geomx.sync.mixed:MixedSync",
        "hfa": "geomx.sync.hfa:HFA",
        "esync": "geomx.sync.esync:ESync",
    },
    "sched": {
        "p3": "geomx.sched.p3:P3",
        "dgt": "geomx.sched.dgt:Dgt",
        "tsengine": "geomx.sched.ts_overlay:TsEngine",
    },
    "topology": {
        "hips": "geomx.topology.hips:HiPS",
        "flat": "geomx.topology.flat:FlatPS",
        "netstorm": "geomx.topology.netstorm:NetStorm",
        "mlnet": "geomx.topology.mlnet:MLNet",
        "mxnet": "geomx.topology.mxnet:MXNet",
    },
    "codec": {
        "none": "geomx.codec.identity:DenseCodec",
        "fp16": "geomx.codec.fp16:FP16Codec",
        "bf16": "geomx.codec.bf16:BF16Codec",
        "bsc": "geomx.codec.bsc:BiSparseCodec",
        "mpq": "geomx.codec.mpq:MPQ",
        "onebit": "geomx.codec.onebit:OneBitCodec",
    },
}


class PolicyError(ValueError):
    """A policy that cannot be found, loaded or used; one line naming the policy."""


def builtin_names(kind: str) -> tuple[str, ...]:
    return tuple(BUILTIN[kind])


def is_builtin(kind: str, spec: str) -> bool:
    return spec in BUILTIN.get(kind, {})


def describe_spec(kind: str, spec: str) -> str:
    """How errors name a policy: ``sync policy 'lab/ssp.py:BoundedStaleness'``."""
    return f"{kind} policy {spec!r}"


def _split(spec: str) -> tuple[str, str]:
    where, sep, cls = spec.rpartition(":")
    if not sep or not where or not cls:
        return spec, ""
    if len(where) == 1 and where.isalpha():  # a Windows drive letter, no class given
        return spec, ""
    return where, cls


def import_file(path: str, *, prefix: str, label: str, error: type[Exception] = PolicyError,
                reuse: bool = True) -> Any:
    """The module in file ``path``, imported as ``prefix`` + a hash of its absolute path,
    with its folder on ``sys.path`` as ``python path`` would have it (so its own modules
    import); ``reuse``: a module this process already imported from it is returned as it
    is (a policy class must stay the same class), else the file runs again. Raises
    ``error`` with one line starting with ``label``. Training programs
    (geomx/node/program.py) and user policies load the same way."""
    if not os.path.isfile(path):
        raise error(f"{label}: no such file {path!r} (a relative path is taken next to "
                    "the scenario file)")
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    mod_name = f"{prefix}{zlib.crc32(os.path.abspath(path).encode()):08x}"
    if reuse and mod_name in sys.modules:
        return sys.modules[mod_name]
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    if mspec is None or mspec.loader is None:
        raise error(f"{label}: cannot load {path!r} as Python")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    try:
        mspec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise error(f"{label} failed to import: {type(e).__name__}: {e}") from e
    return module


def import_name(name: str) -> Any:
    """Import module ``name`` as ``python -m`` would find it: from ``sys.path``, else from
    the working directory (a real node starts as ``python -m geomx``, which puts the
    working directory on the path; the ``geomx`` command does not, and without this
    fallback a ``module:Class`` name would load over sockets but not in the emulator)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        if e.name != name.partition(".")[0] or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(name)


def _load_module(name: str, label: str) -> Any:
    try:
        return import_name(name)
    except Exception as e:
        raise PolicyError(f"{label}: cannot import module {name!r}: "
                          f"{type(e).__name__}: {e}") from e


def _entry_point(spec: str) -> str | None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == spec:
            return str(ep.value)
    return None


def entry_point_names() -> tuple[str, ...]:
    """The names installed plug-ins register in the ``geomx.policies`` group."""
    return tuple(sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}))


#: The class attribute that records the spec a user class was first found by. A codec's
#: ``config()`` names its class by it, so the dict that travels to every node finds the
#: same class there.
SPEC_ATTRIBUTE = "registry_spec"


def spec_of(cls: type) -> str | None:
    """The spec :func:`policy_class` found user class ``cls`` by (None: a built-in, or
    a class no scenario named)."""
    return cls.__dict__.get(SPEC_ATTRIBUTE)


def dense_codec() -> Any:
    """The identity codec (``none``), for a user codec's ``codec_for`` that sends some
    hops or sizes dense; found here by name, as any built-in is."""
    return policy_class("codec", "none")()


def _base_of(kind: str) -> type:
    if kind == "sync":
        from geomx.policy.sync import SyncAlgorithm
        return SyncAlgorithm
    if kind == "sched":
        from geomx.policy.scheduling import TransferScheduler
        return TransferScheduler
    if kind == "topology":
        from geomx.policy.topology import Topology
        return Topology
    from geomx.policy.codec import Codec, CodecPolicy
    return CodecPolicy if kind == "codec" else Codec


def policy_class(kind: str, spec: str) -> type:
    """The class ``spec`` names for a policy of ``kind`` (one of :data:`KINDS`).

    Raises :class:`PolicyError`: unknown built-in name (listing them), a file or module
    that does not import, a missing class, a class of another kind, or one that leaves
    abstract methods unwritten.
    """
    if kind not in KINDS:
        raise PolicyError(f"unknown policy kind {kind!r}; allowed: {', '.join(KINDS)}")
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyError(f"{kind} policy: a name is required, one of "
                          f"{', '.join(BUILTIN[kind]) or 'a file.py:Class'}, or file.py:Class, "
                          "package.module:Class, an installed plug-in name")
    spec = spec.strip()
    label = describe_spec(kind, spec)
    target = BUILTIN[kind].get(spec)
    if target is None and ":" not in spec and spec.endswith(".py"):
        raise PolicyError(f"{label}: name the class, as in 'file.py:Class'")
    if target is None and ":" not in spec:
        target = _entry_point(spec)
        if target is None:
            names = ", ".join(repr(n) for n in BUILTIN[kind])
            raise PolicyError(f"unknown {kind} policy {spec!r}; allowed: {names}, "
                              "'file.py:Class', 'package.module:Class' or an installed "
                              f"'{ENTRY_POINT_GROUP}' plug-in")
    where, cls_name = _split(target or spec)
    if not cls_name:
        raise PolicyError(f"{label}: name the class, as in 'file.py:Class'")
    if where.endswith(".py") or os.sep in where or "/" in where:
        module = import_file(where, prefix="geomx_user_policy_", label=label)
    else:
        module = _load_module(where, label)
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise PolicyError(f"{label}: {where!r} has no class {cls_name!r}")
    base = _base_of(kind)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PolicyError(f"{label}: {cls_name} is not a {kind} policy; subclass "
                          f"geomx.policy.{base.__name__}")
    missing = sorted(getattr(cls, "__abstractmethods__", ()) or ())
    if inspect.isabstract(cls) and missing:
        raise PolicyError(f"{label}: {cls_name} does not implement "
                          f"{', '.join(missing)} (required by geomx.policy.{base.__name__})")
    if f"{cls.__module__}:{cls.__qualname__}" not in BUILTIN[kind].values() \
            and not cls.__module__.startswith("geomx."):
        if kind == "codec":
            _check_codec_name(cls, cls_name, label)
        if SPEC_ATTRIBUTE not in cls.__dict__:
            setattr(cls, SPEC_ATTRIBUTE, spec)
        _guard(kind, cls, label)
    return cls


def _check_codec_name(cls: type, cls_name: str, label: str) -> None:
    """A receiver picks a payload's decoder by its codec's ``name`` (``meta["codec"]``), so
    a user codec needs a name of its own: none, or a built-in's, would decode its
    payloads with another codec (or replace the built-in's decoder for every job)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(f"{label}: {cls_name} has no name; set the class attribute "
                          "name = \"...\" (receivers pick the decoder by it)")
    if name in BUILTIN["codec"]:
        raise PolicyError(f"{label}: {cls_name}.name = {name!r} is a built-in codec's name; "
                          f"allowed: a name of its own (not {', '.join(BUILTIN['codec'])})")


def _guard(kind: str, cls: type, label: str) -> None:
    """Make the user class's hooks fail in one line naming it (:mod:`geomx.policy.guard`)."""
    from geomx.policy.guard import guard_class

    if kind == "codec":
        from geomx.policy.codec import Codec, CodecError, CodecPolicy

        guard_class(cls, Codec if issubclass(cls, Codec) else CodecPolicy, label, (CodecError,))
    elif kind == "sync":
        from geomx.policy import sync

        sides = {"global_side": sync.GlobalSide, "local_side": sync.LocalSide,
                 "worker_side": sync.WorkerSide}
        service = getattr(sync, "StateService", None)
        if service is not None:
            sides["state_service"] = service
        guard_class(cls, _base_of(kind), label, makes=sides)
    else:
        guard_class(cls, _base_of(kind), label)
