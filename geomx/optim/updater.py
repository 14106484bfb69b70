"""An updater: an optimizer plus the per-key states it needs (MXNet's ``get_updater``).

A global server calls ``updater(key, received, stored)`` when a round for ``key`` is
complete (docs/geomx-behaviour.md §3.2); the state for a key is created on its first update
from the stored weight, as MXNet does.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import Optimizer

__all__ = ["Updater"]


class Updater:
    """Owns the states of one optimizer, keyed by kvstore key (or (key, part))."""

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self.states: dict[Hashable, Any] = {}

    def __call__(self, key: Hashable, grad: np.ndarray, weight: np.ndarray, *, sender: str | None = None) -> None:
        """Apply ``grad`` to ``weight`` in place (MXNet's argument order: key, recv, stored)."""
        state = self.states.get(key)
        if state is None and key not in self.states:
            state = self.states[key] = self.optimizer.create_state(key, weight)
        self.optimizer.update(key, weight, grad, state, sender=sender)

    def note_pull(self, key: Hashable, sender: str, weight: np.ndarray) -> None:
        """Tell the optimizer what ``sender`` pulled; a no-op unless it needs it."""
        if self.optimizer.needs_pull_notes:
            self.optimizer.note_pull(key, sender, weight)
