"""Ports for tests that start listeners or node processes themselves.

The launcher's picker is used so that tests draw ports the way a job does: free now and
outside the kernel's ephemeral range, where an outgoing connection's source port could
take them before the test binds them.
"""

from __future__ import annotations

from geomx.runtime.launcher import free_port_block as _launcher_block


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    return _launcher_block("127.0.0.1", 1)


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive free ports on 127.0.0.1 (a job's ``port_base``)."""
    return _launcher_block("127.0.0.1", count)
