"""Checkpoints: each server's and worker's state at a global round every node agrees on.

Why this shape (as Horovod Elastic / torchrun resume from checkpoints, ps-lite
recovers servers from theirs):

* **When.** Global server 0's decision (every ``every`` rounds, or the first round that
  ends ``every`` seconds after the last checkpoint) travels with the round's replies as
  ``meta["ckpt"] = round``: a global server snapshots once every one of its keys finished
  that round, a local server once it has answered its workers for every key of it, a
  worker right after the training step that received it. Under FSA and HFA (global
  syncs) nothing of the next round can have started anywhere at those moments: a
  worker pushes round r+1 only after pulling every key of round r. So the files of one
  round form a consistent cut without pausing the job.
* **What.** Stores, optimizer states, codec error-feedback buffers, sync-policy state,
  the servers' transfer-scheduler state (``state_dict`` of their sides,
  geomx/policy/scheduling.py), round and iteration counters, and a worker's
  data-stream position, RNG state and local model (HFA). Values are ``npz`` arrays (loaded with ``allow_pickle=False``);
  structure and scalars are JSON inside the same file, so one rename publishes a node's
  whole state.
* **Atomic.** A node writes ``<round>/<node>.npz`` to a temporary name, fsyncs it and
  renames it; the node whose file completes the set writes ``manifest.json`` the same
  way. A checkpoint without a manifest is incomplete and never loaded, so a crash while
  writing leaves the previous checkpoint as the latest complete one.
* **Lost workers.** With ``[membership] on_worker_loss = "continue"`` a local server's
  file names its DC's live workers at that round (meta ``live``); the set is complete
  with the servers' files and those workers' files, and the manifest lists the others
  as ``lost``. Resuming starts every process of the job again: a worker the checkpoint
  lists as lost has no file and comes back as a rejoined one does (docs/reliability.md),
  from the model of the checkpoint's round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
META_ARRAY = "__meta__"


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or does not fit this job."""


# --------------------------------------------------------------------------- state trees
def pack(obj: Any, arrays: dict[str, np.ndarray], prefix: str) -> Any:
    """``obj`` as JSON, its arrays moved into ``arrays`` under names starting with ``prefix``.

    Handles what node state is made of: None, bools, numbers, strings, numpy arrays and
    scalars, lists, tuples, dicts (any hashable JSON-able keys) and dataclasses (such as
    optimizer and codec states). Anything else is refused by type name, never pickled.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        if isinstance(obj, float) and not np.isfinite(obj):
            return {"__float__": repr(obj)}
        return obj
    if isinstance(obj, np.generic):
        return {"__scalar__": obj.dtype.str, "v": pack(obj.item(), arrays, prefix)}
    if hasattr(obj, "__cuda_array_interface__"):
        obj = obj.copy_to_host()
    if isinstance(obj, np.ndarray):
        name = f"{prefix}#{len(arrays)}"
        arrays[name] = np.ascontiguousarray(obj)
        return {"__nd__": name}
    if isinstance(obj, tuple):
        return {"__tuple__": [pack(v, arrays, f"{prefix}/{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [pack(v, arrays, f"{prefix}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return {"__dict__": [[pack(k, arrays, f"{prefix}/k{i}"), pack(v, arrays, f"{prefix}/{i}")]
                             for i, (k, v) in enumerate(obj.items())]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__fields__": {f.name: pack(getattr(obj, f.name), arrays, f"{prefix}.{f.name}")
                               for f in dataclasses.fields(obj)}}
    raise CheckpointError(f"cannot checkpoint a {type(obj).__name__} at {prefix!r}; allowed: "
                          "None, numbers, strings, numpy arrays, lists, tuples, dicts, "
                          "dataclasses")


@dataclasses.dataclass
class Deferred:
    """A saved state object (a dataclass) waiting for a fresh instance to fill, e.g. an
    optimizer state before the optimizer exists."""

    tree: Any
    arrays: Any

    def fill(self, template: Any) -> Any:
        return unpack(self.tree, self.arrays, template)


def restore_into(saved: Any, template: Any) -> Any:
    """``saved`` (from :func:`unpack`) with any :class:`Deferred` filled from ``template``."""
    if isinstance(saved, Deferred):
        return saved.fill(template)
    if isinstance(saved, list) and isinstance(template, list):
        return [restore_into(v, template[i] if i < len(template) else None)
                for i, v in enumerate(saved)]
    if isinstance(saved, tuple) and isinstance(template, tuple):
        return tuple(restore_into(v, template[i] if i < len(template) else None)
                     for i, v in enumerate(saved))
    if isinstance(saved, dict) and isinstance(template, dict):
        return {k: restore_into(v, template.get(k)) for k, v in saved.items()}
    return saved


def _key(k: Any) -> Any:
    return tuple(_key(x) for x in k) if isinstance(k, list) else k


def unpack(tree: Any, arrays: Any, template: Any = None) -> Any:
    """The inverse of :func:`pack`. A dataclass comes back by filling ``template`` (a fresh
    instance of the same class, e.g. ``optimizer.create_state(key, weight)``) in place."""
    if isinstance(tree, list):
        tmpl = template if isinstance(template, list) else [None] * len(tree)
        return [unpack(v, arrays, tmpl[i] if i < len(tmpl) else None) for i, v in enumerate(tree)]
    if not isinstance(tree, dict):
        return tree
    if "__nd__" in tree:
        return np.array(arrays[tree["__nd__"]], copy=True)
    if "__float__" in tree:
        return float(tree["__float__"])
    if "__scalar__" in tree:
        return np.dtype(tree["__scalar__"]).type(tree["v"])
    if "__tuple__" in tree:
        tmpl = template if isinstance(template, tuple) else ()
        return tuple(unpack(v, arrays, tmpl[i] if i < len(tmpl) else None)
                     for i, v in enumerate(tree["__tuple__"]))
    if "__dict__" in tree:
        tmpl = template if isinstance(template, dict) else {}
        out = {}
        for k, v in tree["__dict__"]:
            key = _key(unpack(k, arrays))
            out[key] = unpack(v, arrays, tmpl.get(key))
        return out
    if "__fields__" in tree:
        if template is None:
            return Deferred(tree, arrays)
        if not dataclasses.is_dataclass(template):
            raise CheckpointError(f"a saved state object cannot fill a "
                                  f"{type(template).__name__}; the job's optimizer or codec "
                                  "differs from the checkpoint's")
        for name, sub in tree["__fields__"].items():
            setattr(template, name, unpack(sub, arrays, getattr(template, name, None)))
        return template
    raise CheckpointError(f"malformed checkpoint entry {sorted(tree)!r}")


# --------------------------------------------------------------------------- files
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Any) -> None:
    """``write(file)`` into a temporary file beside ``path``, fsync, rename over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def file_name(node: str) -> str:
    """A node's file name (``gs:0`` -> ``gs_0.npz``: no ':' in file names)."""
    return node.replace(":", "_") + ".npz"


def write_node_file(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    blob = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **{META_ARRAY: blob}, **arrays))


def read_node_meta(path: Path) -> dict[str, Any]:
    """A node file's JSON meta alone (its arrays stay on disk)."""
    with np.load(path, allow_pickle=False) as z:
        return json.loads(bytes(z[META_ARRAY]).decode())


def read_node_file(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A node file's JSON meta and its arrays (no pickle)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays.pop(META_ARRAY)).decode())
    return meta, arrays


def expected_nodes(job: Any) -> list[str]:
    """The nodes whose files make a checkpoint complete: servers and training workers."""
    nodes = list(job.global_servers)
    if job.mode == "hips":
        nodes += [job.local_server_of[d] for d in job.party_dcs]
    return nodes + list(job.all_workers)


def complete_rounds(ckpt_dir: Path) -> list[int]:
    """Rounds of ``ckpt_dir`` with a manifest and every file it lists, ascending."""
    out = []
    if not ckpt_dir.is_dir():
        return out
    for d in ckpt_dir.iterdir():
        if not d.name.isdigit() or not (d / MANIFEST).is_file():
            continue
        try:
            manifest = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
        if all((d / file_name(n)).is_file() for n in manifest.get("nodes", [])):
            out.append(int(d.name))
    return sorted(out)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder of a run folder, or None."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    rounds = complete_rounds(ckpt_dir)
    return ckpt_dir / str(rounds[-1]) if rounds else None


def read_manifest(round_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(round_dir) / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{round_dir} is not a complete checkpoint (no readable "
                              f"{MANIFEST}: {e})") from None


# --------------------------------------------------------------------------- per node
class NodeCheckpoints:
    """One node's side: when a round is a checkpoint round, saving, loading.

    ``settings`` is ``JobSpec.checkpoint``: ``every_rounds``, ``every_s``, ``keep``,
    ``dir`` (where this run's checkpoints go), ``resume_from`` (a checkpoint folder).
    """

    def __init__(self, job: Any, node: str):
        settings = dict(getattr(job, "checkpoint", None) or {})
        self.node = node
        self.every_rounds = int(settings.get("every_rounds", 0))
        self.every_s = float(settings.get("every_s", 0.0))
        self.keep = int(settings.get("keep", 2))
        self.dir = Path(settings["dir"]) if settings.get("dir") else None
        self.resume_from = Path(settings["resume_from"]) if settings.get("resume_from") else None
        self.nodes = expected_nodes(job)
        #: a local server's file -> its DC's workers (whose files it may excuse as lost)
        workers_of = getattr(job, "workers_of", None) or {}
        self.dc_workers: dict[str, list[str]] = (
            {job.local_server_of[d]: list(workers_of.get(d, ())) for d in job.party_dcs}
            if job.mode == "hips" else {})
        #: resuming: this worker was lost when the checkpoint was taken (it has no file)
        #: and comes back as a rejoined worker does
        self.rejoins = False
        self.last_t = float(settings.get("start_t", 0.0))

    @property
    def enabled(self) -> bool:
        return self.dir is not None and (self.every_rounds > 0 or self.every_s > 0)

    def due(self, round_: int, now: float) -> bool:
        """Global server 0 (or every global server, for a rounds period): is ``round_`` a
        checkpoint round? Called once per round."""
        if not self.enabled or round_ <= 0:
            return False
        if self.every_rounds > 0:
            return round_ % self.every_rounds == 0
        if now - self.last_t >= self.every_s:
            self.last_t = now
            return True
        return False

    def save(self, round_: int, state: Any, meta: dict[str, Any]) -> Path:
        """Write this node's file for ``round_``; the last node to write adds the manifest."""
        assert self.dir is not None
        round_dir = self.dir / str(round_)
        round_dir.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        tree = pack(state, arrays, "state")
        path = round_dir / file_name(self.node)
        write_node_file(path, arrays, {"node": self.node, "round": round_, "state": tree, **meta})
        needed = self._needed(round_dir)
        if needed is not None and all((round_dir / file_name(n)).is_file() for n in needed):
            self._complete(round_dir, round_, needed)
        return path

    def _needed(self, round_dir: Path) -> list[str] | None:
        """The nodes whose files complete ``round_dir``: every node but the workers a
        local server's file names as not live; None while a local server's file is
        missing (it says which of its workers count)."""
        lost: set[str] = set()
        for server, workers in self.dc_workers.items():
            path = round_dir / file_name(server)
            if not path.is_file():
                return None
            live = read_node_meta(path).get("live")
            if live is not None:
                lost.update(w for w in workers if w not in live)
        return [n for n in self.nodes if n not in lost]

    def _complete(self, round_dir: Path, round_: int, needed: list[str]) -> None:
        times = []
        for n in needed:
            times.append(float(read_node_meta(round_dir / file_name(n)).get("t", 0.0)))
        manifest: dict[str, Any] = {"round": round_, "nodes": needed, "t": max(times)}
        lost = [n for n in self.nodes if n not in needed]
        if lost:
            manifest["lost"] = lost
        data = json.dumps(manifest, sort_keys=True, indent=1).encode()
        atomic_write(round_dir / MANIFEST, lambda f: f.write(data))
        assert self.dir is not None
        for old in complete_rounds(self.dir)[:-self.keep]:
            shutil.rmtree(self.dir / str(old), ignore_errors=True)
        newest_kept = complete_rounds(self.dir)[-self.keep:]
        for d in self.dir.iterdir():  # incomplete folders older than what is kept
            if d.name.isdigit() and newest_kept and int(d.name) < newest_kept[0]:
                shutil.rmtree(d, ignore_errors=True)

    def load(self) -> tuple[Any, dict[str, Any], dict[str, np.ndarray]] | None:
        """This node's saved state tree, meta and arrays when the run resumes, else None."""
        if self.resume_from is None:
            return None
        manifest = read_manifest(self.resume_from)
        path = self.resume_from / file_name(self.node)
        if not path.is_file() and self.node in manifest.get("lost", []):
            self.rejoins = True
            return None
        if not path.is_file():
            raise CheckpointError(f"{self.resume_from} has no file for {self.node}; the job's "
                                  "nodes differ from the checkpoint's")
        meta, arrays = read_node_file(path)
        return meta.pop("state"), meta, arrays


def keys_in_round(round_: int, keys: Iterable[Any], has_run: Callable[[Any], bool]) -> int:
    """How many of a server's ``keys`` (its initialised slots) finish checkpoint round
    ``round_``, the count a server waits for before it saves that round.

    From round 2 on, those that have finished a round (``has_run``): a key that was
    initialised and never pushed -- a value a program only broadcasts, such as
    ``geomx.torch``'s optimizer hyper-parameters -- takes part in none. Round 1 cannot
    tell a key not pushed yet from one never pushed, so there it is every key. A
    synchronous round r needs every key's round r-1 done before any key finishes r, so
    the count does not move while round r finishes."""
    keys = list(keys)
    return len(keys) if round_ < 2 else sum(1 for k in keys if has_run(k))


def codec_states(codec: Any) -> dict[str, Any]:
    """A :class:`~geomx.node.link_codec.LinkCodec`'s error-feedback states, as saved,
    with the codec config they belong to (a resumed node may install its codec after
    loading them: :class:`~geomx.node.link_codec.SavedCodecMemory`)."""
    return {"config": codec.identity,
            "states": [[list(k), {"n": st.num_elements, "u": st.u, "v": st.v,
                                  "residual": st.residual, "round": st.round}]
                       for k, st in codec.states.items()]}


def restore_codec_states(codec: Any, saved: Any, record: Any) -> None:
    """Resuming: hand ``codec`` (the node's codec now) the checkpoint's error-feedback
    memory; it fills the codec it belongs to, this one or one installed later
    (:class:`~geomx.node.link_codec.SavedCodecMemory`), and ``record`` notes at the node's
    first push which it resumed with. A saved list without a config (checkpoints written
    before configs were saved with it) belongs to the codec the node starts with.
    Malformed entries are a :class:`CheckpointError` here, before anything runs."""
    from geomx.node.link_codec import SavedCodecMemory
    from geomx.policy.codec import CodecState

    if isinstance(saved, list):
        saved = {"config": codec.identity, "states": saved}
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict) \
            or not isinstance(saved.get("states"), list):
        raise CheckpointError("malformed codec state in the checkpoint: expected its codec "
                              f"config and a list of states, got {type(saved).__name__}")
    codec.states.clear()
    states: dict[tuple[str, int, int], CodecState] = {}
    for k, st in saved["states"]:
        key = _codec_state_key(k)
        n = int(st["n"])
        for f in ("u", "v", "residual"):
            a = st.get(f)
            if a is not None and (not isinstance(a, np.ndarray) or a.dtype != np.float32
                                  or a.size != n):
                raise CheckpointError(f"codec state {f!r} of {key} in the checkpoint is not "
                                      f"float32 with {n} elements")
        states[key] = CodecState(n, u=st["u"], v=st["v"], residual=st["residual"],
                                 round=int(st["round"]))
    if states:
        codec.hold(SavedCodecMemory(saved["config"], states, record))


def _codec_state_key(k: Any) -> tuple[str, int, int]:
    if not isinstance(k, (list, tuple)) or len(k) != 3 or not isinstance(k[0], str):
        raise CheckpointError(f"malformed codec state key {k!r} in the checkpoint: expected "
                              "(tier, key, part)")
    return (k[0], int(k[1]), int(k[2]))


def sched_state(side: Any) -> Any:
    """A node's transfer-scheduler side's state (``state_dict``, geomx/policy/scheduling.py),
    as saved; None without a side or when it keeps nothing across rounds."""
    return side.state_dict() if side is not None else None


def restore_sched_state(side: Any, saved: Any) -> None:
    """Hand a saved transfer-scheduler state back to the node's side; one that does not
    fit (the checkpoint ran other schedulers) is a :class:`CheckpointError`."""
    if saved is None:
        return
    if side is None:
        raise CheckpointError("the checkpoint has transfer-scheduler state and this job "
                              "runs no scheduler there ([sched] differs from the checkpoint's)")
    try:
        side.load_state_dict(saved)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def optimizer_private(opt: Any) -> dict[str, Any]:
    """An optimizer's private attributes (``_name``): state kept outside per-key states
    (DC-ASGD's per-sender pulled weights)."""
    return {k: v for k, v in vars(opt).items() if k.startswith("_")} if opt is not None else {}


def rng_state(rng: np.random.Generator) -> str:
    return json.dumps(rng.bit_generator.state)


def set_rng_state(rng: np.random.Generator, text: str) -> None:
    rng.bit_generator.state = json.loads(text)


# --------------------------------------------------------------------------- injected crashes
INJECTED_CRASHES = "crashes.jsonl"
"""Run-folder file: one JSON line per ``[[fault]]`` crash injected (node, at), written when
it happens by either runtime; ``--resume`` does not inject those again."""


def note_crash(run_dir: Path, node: str, at_s: float) -> None:
    with open(run_dir / INJECTED_CRASHES, "a") as f:
        f.write(json.dumps({"node": node, "at": at_s}) + "\n")


def injected_crashes(run_dir: Path) -> set[tuple[str, float]]:
    try:
        lines = (run_dir / INJECTED_CRASHES).read_text().splitlines()
    except OSError:
        return set()
    out = set()
    for line in lines:
        try:
            d = json.loads(line)
            out.add((str(d["node"]), float(d["at"])))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a crash of the writer
    return out
