"""Synchronisation algorithms as policies that nodes call (see ``policy.py``).

``fsa`` (fully synchronous), ``mixed`` (MixedSync: sync in a DC, async across DCs, with
an optional staleness bound), ``hfa`` (hierarchical frequency aggregation) and ``esync``
(state-server-sized local steps), chosen by ``[sync] algorithm`` in a scenario. DC-ASGD
is a global-server optimizer (``geomx.optim``) that MixedSync feeds with senders and pulls.
"""
