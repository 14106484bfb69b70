"""A worker or global server started without a rank claims the first free one.

GeoMX's launch scripts give a worker only ``DMLC_ROLE=worker`` and the scheduler's
address; ps-lite's scheduler then numbers nodes in the order they register. geomx names
nodes from the scenario (``w:{dc}:{rank}``, ``gs:{rank}``) and a node's name must be fixed
before it starts (its transport, event file and peers use it), so a node without
``--rank`` / ``GEOMX_RANK`` first asks its scheduler, which numbers claimants the way
ps-lite would: from a short-lived transport under a provisional name ``claim:TOKEN`` it
sends a REGISTER with ``meta = {"claim": TOKEN, "kind": "w:DC:"}``; the scheduler reserves
the first member name of that kind that nobody registered or claimed, for the token, and
answers with it (:meth:`geomx.node.scheduler.Scheduler._on_claim`). The process then
starts under that name and registers with the token, so nobody else can take its place.
The provisional name keeps replies apart: two processes never share a name, even for a
moment (a refusal for one cannot reach the other).

Ranks claimed this way follow start-up order, which differs between runs as in ps-lite;
give ranks explicitly where a stable data partition per host matters.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import replace
from collections.abc import Awaitable, Callable
from typing import Any

from geomx.node.scheduler import CLAIM_PREFIX
from geomx.wire import Kind, Message

log = logging.getLogger(__name__)

#: meta keys of a claim (REGISTER) and of the claimed node's own registration
CLAIM_META = "claim"
TOKEN_META = "claim_token"


def _kind_prefix(name: str) -> str:
    """``w:party-a:`` for ``w:party-a:0``; ``gs:`` for ``gs:0``."""
    return name.rsplit(":", 1)[0] + ":"


async def claim_rank(cfg: Any, plan: Any, start_transport: Callable[..., Awaitable[Any]], *,
                     reply_timeout_s: float = 30.0) -> tuple[Any, str]:
    """``(cfg under the claimed name, token)`` for a node config with ``claim_rank`` set;
    ``plan`` is the job's plan (``cluster.plan_job``).

    ``start_transport(cfg, plan, name, shape=False)`` starts the provisional transport. Raises
    ``ConnectionError`` when the scheduler does not answer and ``ConfigError`` when every
    rank of the kind is taken (more such processes than the scenario has nodes of it)."""
    from geomx.runtime.config import ConfigError

    token = secrets.token_hex(8)
    provisional = f"{CLAIM_PREFIX}{token}"
    scheduler = plan.job.schedulers_of(cfg.name)[-1]  # its own tier's scheduler
    kind = _kind_prefix(cfg.name)
    transport = await start_transport(cfg, plan, provisional, shape=False)
    try:
        await transport.send(Message(Kind.REGISTER, provisional, scheduler, request_id=1,
                                     meta={"address": transport.local_address(),
                                           "role": cfg.role, CLAIM_META: token, "kind": kind}))
        reply = await asyncio.wait_for(transport.recv(), reply_timeout_s)
    except asyncio.TimeoutError:
        raise ConnectionError(f"scheduler {scheduler} did not answer a rank claim for a "
                              f"{kind}* node within {reply_timeout_s:g} s") from None
    finally:
        await transport.close(flush_timeout_s=1.0)
    name = reply.meta.get("claimed")
    if reply.kind != Kind.REGISTER_ACK or reply.meta.get("token") != token \
            or not isinstance(name, str) or not name.startswith(kind):
        raise ConfigError(f"{scheduler} gave no rank: {reply.meta.get('reason', reply.kind.name)}")
    log.info("claimed %s from %s", name, scheduler)
    sources = dict(cfg.sources)
    sources["name"] = f"claimed from {scheduler} (first free rank)"
    return replace(cfg, name=name, claim_rank=False, sources=sources), token
