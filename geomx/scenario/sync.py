"""``[sync]``: the synchronisation algorithm and its parameters (docs/geomx-behaviour.md §3,
docs/papers.md §5, §6.2, §6.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from geomx.scenario.kinds import Duration, Integer, OptionsTable, PolicyName, Real, Section, setting


ALGORITHMS = ("fsa", "mixed", "hfa", "esync")


@dataclass(frozen=True)
class SyncConfig(Section):
    """When servers aggregate and reply: the synchronisation algorithm and its parameters."""

    algorithm: str = setting(PolicyName("sync", "auto", *ALGORITHMS), "auto",
                             "`fsa`: fully synchronous; `mixed`: sync in a DC, async across DCs; "
                             "`hfa`: hierarchical frequency aggregation; `esync`: ESync; `auto`: "
                             "as GeoMX, the training program's kvstore type decides (`fsa`, or "
                             "`mixed` when it creates a `dist_async` store); "
                             "`\"file.py:Class\"`: an algorithm of your own (docs/extending.md).")
    staleness: int = setting(Integer(min=0), 0,
                             "mixed: a DC more than this many versions ahead of the slowest DC "
                             "waits for it (0 = unbounded, as in GeoMX).")
    k1: int = setting(Integer(min=1), 20, "hfa: local steps per local sync.")
    k2: int = setting(Integer(min=1), 10, "hfa: local syncs per global sync.")
    dcasgd_lambda: float = setting(Real(min=0), 0.04,
                                   "Variance-control factor (lambda) of the dcasgd / dcasgd_shared "
                                   "global optimizers (GeoMX/MXNet default 0.04).")
    esync_epsilon_s: float = setting(Duration(), "0s",
                                     "esync: slack of the ready rule -- a worker stops taking local "
                                     "steps once one more step plus this would end after the slowest "
                                     "worker's step (the paper uses 0.5s for second-long steps; scale "
                                     "it with your step times).",
                                     key="esync_epsilon")
    esync_max_local_steps: int = setting(Integer(min=1), 64, "esync: upper bound on local steps per round.")
    options: tuple = setting(OptionsTable(), {},
                             "`[sync.options]`: the options of a user algorithm, checked once at "
                             "load against its options dataclass (the built-ins read the keys "
                             "of this table).", default_doc="`{}`")

    @property
    def options_table(self) -> dict[str, Any]:
        """``[sync.options]`` as a plain table (arrays as lists)."""
        return OptionsTable().emit(self.options)

    @property
    def resolved_algorithm(self) -> str:
        """The algorithm the job starts with (``auto`` starts as ``fsa``)."""
        return "fsa" if self.algorithm == "auto" else self.algorithm
