"""Max-min fair sharing with strict priority classes: the emulator's bandwidth solver.

The network model (:mod:`geomx.sim.network`) asks this solver for the rate of every
flow; the solver knows nothing of links, messages or time. Its shape is SimGrid's
linear max-min system (``src/kernel/lmm``: a ``System`` of ``Constraint`` and
``Variable``): a :class:`Constraint` is a shared resource with a capacity (one
direction of a link), a :class:`Variable` is one user of several constraints with an
upper bound (a flow's window/RTT cap) and a priority class, and
:meth:`SharingSystem.solve` gives every enabled variable its rate. The solver's
scratch state (residual capacities, counts, visit marks) lives in these records of its
own, never on the network's links.

*Allocation.* Progressive filling (water-filling) over the constraints of the enabled
variables (Bertsekas & Gallager, *Data Networks*, §6.5.2): repeatedly find the tightest
constraint, the one whose residual capacity divided by its number of unfrozen
variables is smallest, or the smallest bound; freeze the variables it binds at that
rate and subtract them from every constraint they use. Strict priority classes are
filled one after the other: class 0 first, lower classes share what remains.

*Selective update.* Only the connected components (variables joined by shared
constraints) of the constraints changed since the last solve are solved again: a
component's max-min shares do not depend on any other, so the rest keep their values
exactly. Variables are visited in the order they were enabled and constraints in the
order they became busy, the order a solve over everything visits them in, so every
floating-point operation and tie is the same as there: the cost of a solve follows the
traffic that changed, not the network's size (docs/architecture.md, "Emulator details").
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["Constraint", "SharingSystem", "Variable"]

_INF = math.inf


class Constraint:
    """A shared resource: ``capacity_bps`` split among the enabled variables using it.

    ``n_vars`` is how many enabled variables use it now (it is *busy* while that is
    above 0), ``busy_s`` how long it has been busy in total, not counting the current
    spell, which started at ``busy_since``. Changed only through :class:`SharingSystem`.
    """

    __slots__ = ("capacity_bps", "n_vars", "variables", "busy_order", "busy_since", "busy_s",
                 "resid_bps", "n_free", "class_mark", "visit_mark")

    def __init__(self, capacity_bps: float) -> None:
        self.capacity_bps = float(capacity_bps)
        self.n_vars = 0
        self.variables: dict[Variable, None] = {}
        self.busy_order = 0        # when it last became busy (orders the busy constraints)
        self.busy_since = 0.0
        self.busy_s = 0.0
        # solver scratch
        self.resid_bps = 0.0       # capacity not yet given to frozen variables
        self.n_free = 0            # variables of the class being filled not yet frozen
        self.class_mark = -1
        self.visit_mark = -1


class Variable:
    """One user of ``constraints`` (a flow over its links): at most ``bound_bps``, in
    priority class ``cls`` (0 is served first). ``value_bps`` is its rate from the last
    solve that covered it; ``owner`` is what the caller attached it to."""

    __slots__ = ("owner", "cls", "bound_bps", "constraints", "value_bps", "enable_order",
                 "frozen_mark", "visit_mark")

    def __init__(self, owner: Any, cls: int, bound_bps: float,
                 constraints: tuple[Constraint, ...]) -> None:
        self.owner = owner
        self.cls = cls
        self.bound_bps = bound_bps
        self.constraints = constraints
        self.value_bps = 0.0
        self.enable_order = 0      # when it was last enabled (orders the enabled variables)
        self.frozen_mark = -1
        self.visit_mark = -1


class SharingSystem:
    """The constraints, the enabled variables, and what changed since the last solve."""

    def __init__(self) -> None:
        self._enabled: dict[Variable, None] = {}
        self._by_class: dict[int, dict[Variable, None]] = {}
        self._busy: dict[Constraint, None] = {}
        self._changed: list[Constraint] = []  # constraints whose users or capacity changed
        self._all_changed = False
        self._epoch = 0                       # stamps for visit, class and freeze marks
        self._order = 0                       # enable / busy order stamps

    # -- building -----------------------------------------------------------------------

    def new_constraint(self, capacity_bps: float) -> Constraint:
        return Constraint(capacity_bps)

    def new_variable(self, owner: Any, cls: int, bound_bps: float,
                     constraints: tuple[Constraint, ...]) -> Variable:
        return Variable(owner, cls, bound_bps, constraints)

    @property
    def n_enabled(self) -> int:
        """How many variables are enabled (flows are active)."""
        return len(self._enabled)

    # -- changes ------------------------------------------------------------------------

    def enable(self, var: Variable, now: float) -> None:
        """``var`` starts using its constraints (a flow starts)."""
        self._enabled[var] = None
        self._order += 1
        var.enable_order = self._order
        group = self._by_class.get(var.cls)
        if group is None:
            self._by_class[var.cls] = {var: None}
        else:
            group[var] = None
        for c in var.constraints:  # (attach, inlined: once per flow)
            if c.n_vars == 0:
                self._busy[c] = None
                self._order += 1
                c.busy_order = self._order
                c.busy_since = now
            c.n_vars += 1
            c.variables[var] = None
        self._changed.extend(var.constraints)

    def disable(self, var: Variable, now: float) -> None:
        """``var`` stops using its constraints (a flow ends); its value drops to 0."""
        del self._enabled[var]
        group = self._by_class[var.cls]
        del group[var]
        if not group:
            del self._by_class[var.cls]
        var.value_bps = 0.0
        for c in var.constraints:  # (detach, inlined: once per flow)
            c.n_vars -= 1
            del c.variables[var]
            if c.n_vars == 0:
                del self._busy[c]
                c.busy_s += now - c.busy_since
        self._changed.extend(var.constraints)

    def is_enabled(self, var: Variable) -> bool:
        return var in self._enabled

    def reroute(self, var: Variable, constraints: tuple[Constraint, ...],
                bound_bps: float) -> None:
        """Give a detached ``var`` new constraints and bound (a flow moved to a new
        route: :meth:`detach`, reroute, :meth:`attach`, then :meth:`mark_all_changed`)."""
        var.constraints = constraints
        var.bound_bps = bound_bps

    def set_capacity(self, c: Constraint, capacity_bps: float) -> None:
        """Change a constraint's capacity; :meth:`mark_changed` it for the next solve."""
        c.capacity_bps = capacity_bps

    def mark_changed(self, c: Constraint) -> None:
        self._changed.append(c)

    def mark_all_changed(self) -> None:
        """The next solve covers every enabled variable."""
        self._all_changed = True

    def attach(self, var: Variable, now: float) -> None:
        """``var`` joins its constraints; one it is the only user of becomes busy
        (``n_vars == 1`` afterwards)."""
        for c in var.constraints:
            if c.n_vars == 0:
                self._busy[c] = None
                self._order += 1
                c.busy_order = self._order
                c.busy_since = now
            c.n_vars += 1
            c.variables[var] = None

    def detach(self, var: Variable, now: float) -> None:
        """``var`` leaves its constraints; one left without users becomes idle
        (``n_vars == 0`` afterwards) and books its busy time."""
        for c in var.constraints:
            c.n_vars -= 1
            del c.variables[var]
            if c.n_vars == 0:
                del self._busy[c]
                c.busy_s += now - c.busy_since

    # -- solving ------------------------------------------------------------------------

    def solve(self) -> list[Variable] | None:
        """Max-min fair values for the variables a change can affect; returns them (in
        enable order), to be compared with what the caller had. None when no variable is
        enabled (nothing was solved)."""
        if not self._enabled:
            self._changed = []
            self._all_changed = False
            return None
        flows_all, busy = self._affected()
        if not flows_all:
            return flows_all
        if len(self._by_class) == 1:
            # One class: every busy constraint's count of the class is its n_vars.
            for c in busy:
                c.resid_bps = c.capacity_bps
                c.n_free = c.n_vars
            self._fill(flows_all, busy, True)
        else:
            for c in busy:
                c.resid_bps = c.capacity_bps
            classes: dict[int, list[Variable]] = {}
            for var in flows_all:
                group = classes.get(var.cls)
                if group is None:
                    classes[var.cls] = [var]
                else:
                    group.append(var)
            order = sorted(classes)
            for i, cls in enumerate(order):
                flows = classes[cls]
                self._epoch += 1
                stamp = self._epoch
                touched: list[Constraint] = []
                for var in flows:
                    for c in var.constraints:
                        if c.class_mark != stamp:
                            c.class_mark = stamp
                            c.n_free = 1
                            touched.append(c)
                        else:
                            c.n_free += 1
                self._fill(flows, touched, i == len(order) - 1)
        return flows_all

    def _affected(self) -> tuple[list[Variable], list[Constraint]]:
        """The variables whose values may change, and their constraints: the connected
        components of the constraints changed since the last solve (all of them after
        :meth:`mark_all_changed`)."""
        seeds = self._changed
        self._changed = []
        enabled = self._enabled
        if self._all_changed:
            self._all_changed = False
            return list(enabled), list(self._busy)
        self._epoch += 1
        stamp = self._epoch
        flows: list[Variable] = []
        busy: list[Constraint] = []
        stack = []
        for c in seeds:
            if c.visit_mark != stamp and c.n_vars:
                c.visit_mark = stamp
                busy.append(c)
                stack.append(c)
        while stack:
            for var in stack.pop().variables:
                if var.visit_mark != stamp:
                    var.visit_mark = stamp
                    flows.append(var)
                    for c in var.constraints:
                        if c.visit_mark != stamp:
                            c.visit_mark = stamp
                            busy.append(c)
                            stack.append(c)
        if len(flows) == len(enabled):
            return list(enabled), list(self._busy)
        flows.sort(key=_enable_order)
        busy.sort(key=_busy_order)
        return flows, busy

    def _fill(self, flows: list[Variable], touched: list[Constraint], last: bool) -> None:
        """Progressive filling of one priority class over the constraints' residual
        capacity (``resid_bps``), given each one's number of variables of this class
        (``n_free``). Each round freezes at least one variable; there are as many rounds
        as distinct bottleneck levels (usually one or two). Bounds are sorted only when
        one binds, and the last round of the last class skips the bookkeeping nobody
        will read."""
        self._epoch += 1
        stamp = self._epoch
        mincap = _INF
        for var in flows:
            if var.bound_bps < mincap:
                mincap = var.bound_bps
        capped: list[Variable] | None = None
        ci = 0
        unfrozen = flows
        left = len(flows)
        while left:
            best = _INF
            bottleneck = None
            for c in touched:
                n = c.n_free
                if n:
                    share = c.resid_bps / n
                    if share < best:
                        best = share
                        bottleneck = c
            if best < 0.0:
                best = 0.0
            if mincap <= best:
                if capped is None:
                    capped = sorted((v for v in unfrozen
                                     if v.frozen_mark != stamp and v.bound_bps < _INF),
                                    key=_bound)
                while ci < len(capped) and capped[ci].frozen_mark == stamp:
                    ci += 1
                if ci < len(capped) and capped[ci].bound_bps <= best:
                    var = capped[ci]
                    ci += 1
                    rate = var.bound_bps
                    var.value_bps = rate
                    var.frozen_mark = stamp
                    left -= 1
                    for c in var.constraints:
                        c.resid_bps -= rate
                        c.n_free -= 1
                    continue
                # The variable that set mincap was frozen by a constraint; look again.
                mincap = capped[ci].bound_bps if ci < len(capped) else _INF
            rest = []
            frozen = []
            for var in unfrozen:
                if var.frozen_mark == stamp:
                    continue
                if bottleneck in var.constraints:
                    var.value_bps = best
                    var.frozen_mark = stamp
                    frozen.append(var)
                else:
                    rest.append(var)
            left -= len(frozen)
            if left or not last:
                for var in frozen:
                    for c in var.constraints:
                        c.resid_bps -= best
                        c.n_free -= 1
            unfrozen = rest


def _bound(var: Variable) -> float:
    return var.bound_bps


def _enable_order(var: Variable) -> int:
    return var.enable_order


def _busy_order(c: Constraint) -> int:
    return c.busy_order
