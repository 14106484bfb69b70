"""The built-in synchronisation algorithms, plug-ins of :mod:`geomx.policy.sync`.

``fsa`` (fully synchronous, :mod:`geomx.sync.fsa`), ``mixed`` (MixedSync: sync in a DC,
async across DCs, with an optional staleness bound, :mod:`geomx.sync.mixed`), ``hfa``
(hierarchical frequency aggregation, :mod:`geomx.sync.hfa`) and ``esync``
(state-server-sized local steps, :mod:`geomx.sync.esync`), named by ``[sync] algorithm``
in a scenario and found through :data:`geomx.policy.registry.BUILTIN`. DC-ASGD is a
global-server optimizer (``geomx.optim``) that MixedSync feeds with senders and pulls.
"""
