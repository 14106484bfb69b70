"""Restarting a node the job lost: which nodes may, and how the new process is told.

A process can take the place of one that died in two ways, the same in both runtimes
(``[[fault]] kind = "crash"`` with a duration in the emulator, ``geomx node --rejoin``
over sockets):

- ``"rejoin"``: a training worker the job went on without (``[membership]
  on_worker_loss = "continue"``) comes back; it pulls the current model at a round
  boundary and trains from the next round (geomx/node/trainer.py,
  geomx/node/local_server.py).
- ``"takeover"``: a new process takes over a lost server's name (``[membership]
  on_server_loss = "wait"``); a local server re-pulls the model from the global tier, a
  global server restores its optimizer from its last snapshot, which needs
  ``[checkpoint] every`` (geomx/node/global_server.py).

:func:`restart_mode` decides from the job's membership settings whether a node may
restart, and how; :func:`restart_node` also tells the node, through its declared
:meth:`~geomx.node.base.Node.restart_as`, before it runs. Both runtimes call
:func:`restart_node`, so a restart is refused the same way wherever it is asked for.
"""

from __future__ import annotations

from typing import Literal, Protocol

from geomx.node.spec import JobSpec

__all__ = ["RESTART_MODES", "RestartError", "RestartMode", "Restartable", "restart_mode",
           "restart_node"]

#: How a restarted process joins the job (see the module docstring).
RestartMode = Literal["rejoin", "takeover"]
RESTART_MODES: tuple[RestartMode, ...] = ("rejoin", "takeover")

#: The roles (as :class:`geomx.cluster.JobPlan` names them) that can restart, and how.
_MODE_OF_ROLE: dict[str, RestartMode] = {
    "worker": "rejoin",
    "local_server": "takeover",
    "global_server": "takeover",
}


class Restartable(Protocol):
    """What :func:`restart_node` needs of a node (every role has it from
    :class:`geomx.node.base.Node`)."""

    name: str

    def restart_as(self, mode: RestartMode) -> None: ...


class RestartError(ValueError):
    """A node that this job cannot restart; the one-line message names the node and the
    setting that would allow it."""


def restart_mode(job: JobSpec, name: str, role: str) -> RestartMode:
    """How node ``name`` (of plan role ``role``) restarts in ``job``; raises
    :class:`RestartError` when the job would not take it back."""
    mode = _MODE_OF_ROLE.get(role)
    if mode is None:
        raise RestartError(f"restart of {name}: a {role.replace('_', ' ')} cannot restart; "
                           "allowed: a training worker, a local server or a global server")
    if mode == "rejoin":
        if job.on_worker_loss != "continue":
            raise RestartError(
                f"restart of {name}: the job stops when it loses a worker "
                f"(membership.on_worker_loss = {job.on_worker_loss!r}); allowed: 'continue'")
        if job.sync_algorithm.needs_state_server and not job.sync_algorithm.state_service_rejoins:
            raise RestartError(
                f"restart of {name}: sync algorithm {job.sync_algorithm.name!r} sizes its "
                "rounds on a state server that does not take a lost worker back; allowed: "
                "a sync algorithm without a state server")
        return mode
    if role == "global_server" and not job.sync_algorithm.global_takeover:
        raise RestartError(
            f"restart of {name}: under sync algorithm {job.sync_algorithm.name!r} a "
            "successor cannot rebuild the global model from the local servers' values; "
            "allowed: a local server's restart")
    if name not in job.replaceable_servers():
        needs = ("membership.on_server_loss = 'wait' with topology.kind = 'hips'"
                 if role == "local_server" else
                 "membership.on_server_loss = 'wait' with topology.kind = 'hips' and "
                 "checkpoint.every")
        raise RestartError(f"restart of {name}: the job does not wait for a lost "
                           f"{role.replace('_', ' ')}; allowed: {needs}")
    return mode


def restart_node(node: Restartable, job: JobSpec, role: str) -> RestartMode:
    """Check that ``node`` (of plan role ``role`` in ``job``) may restart
    (:func:`restart_mode`) and tell it so before it runs; returns the mode."""
    mode = restart_mode(job, node.name, role)
    node.restart_as(mode)
    return mode
