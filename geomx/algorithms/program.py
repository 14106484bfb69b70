"""The training program behind ``[training] algorithm``: ``main(kv, ctx)`` on every node.

``cluster.py`` runs it as the program ``geomx.algorithms.program:main`` when a scenario
names an algorithm, so it goes through exactly the path of a user's program (the master
worker publishes initial values, workers train on their partition, the evaluator
reports). Options come from ``[training] program_args`` (``["--clusters", "5"]``) and are
checked when the scenario is loaded (:func:`check_options`).
"""

from __future__ import annotations

import argparse
from typing import Any

from geomx.algorithms.data import Table, load_table, table_shape
from geomx.algorithms.job import AlgorithmError, AlgorithmJob
from geomx.algorithms.registry import algorithm_module, info_of

__all__ = ["main", "parse_options", "check_options", "table_of", "state_bytes"]

PROGRAM = "geomx.algorithms.program:main"


class _Parser(argparse.ArgumentParser):
    """An algorithm's options: errors raise, and the option names are kept for them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: every option string added, in order ("--clusters", ...)
        self.option_names: list[str] = []

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.option_names.extend(action.option_strings)
        return action

    def error(self, message: str) -> None:  # no SystemExit from inside a node
        raise AlgorithmError(message)


def parse_options(name: str, args: list[str] | tuple[str, ...]) -> argparse.Namespace:
    """``name``'s options from ``args`` (``--option value`` pairs); AlgorithmError names the
    bad one and lists the allowed ones."""
    mod = algorithm_module(name)
    p = _Parser(prog=name, add_help=False, allow_abbrev=False)
    mod.add_options(p)
    allowed = ", ".join(sorted(p.option_names)) or "none"
    try:
        opts, rest = p.parse_known_args(list(args))
    except AlgorithmError as e:
        raise AlgorithmError(f"algorithm {name!r}: {e}; allowed options: {allowed}") from None
    if rest:
        raise AlgorithmError(f"algorithm {name!r}: unknown option(s) {' '.join(rest)}; "
                             f"allowed options: {allowed}")
    check = getattr(mod, "check_options", None)
    if check is not None:
        check(opts)
    return opts


def check_options(name: str, args: list[str] | tuple[str, ...]) -> None:
    """Raise AlgorithmError when ``args`` are not valid options of ``name``."""
    parse_options(name, args)


def table_of(dataset: str, *, seed: int, options: dict[str, Any] | None = None,
             path: str | None = None) -> Table:
    kw = {k: v for k, v in (options or {}).items() if k in ("n_samples", "n_features",
                                                             "n_classes")}
    return load_table(dataset, seed=seed, path=path or None, **kw)


def state_bytes(spec: Any, workers: int) -> int:
    """Bytes of the largest shared state the algorithm of ``spec`` (a TrainSpec) moves in
    one round: sizes a request timeout the way the model's size does for models."""
    opts = parse_options(spec.algorithm, spec.program_args)
    kw = {k: v for k, v in spec.dataset_kwargs.items() if k in ("n_features", "n_classes")}
    shape = table_shape(spec.dataset, **kw)
    if shape is None:   # an image data set: its loader knows
        table: Any = table_of(spec.dataset, seed=spec.seed, options=spec.dataset_kwargs,
                              path=spec.data_path)
    else:
        table = argparse.Namespace(num_features=shape[0], num_classes=shape[1])
    return int(algorithm_module(spec.algorithm).state_bytes(table, opts, workers))


async def main(kv: Any, ctx: Any) -> dict[str, Any]:
    name = ctx.algorithm
    info = info_of(name)
    opts = parse_options(name, ctx.args)
    table = table_of(ctx.dataset_name, seed=ctx.seed, options=ctx.dataset_options,
                     path=ctx.data_path)
    wanted = "regression" if info.task == "regression" else "classification"
    if info.task in ("regression", "classification") and table.task != wanted:
        raise AlgorithmError(f"algorithm {name!r} needs a {wanted} data set; "
                             f"training.dataset = {table.name!r} is {table.task}")
    job = AlgorithmJob(kv, ctx, name, opts, table)
    result = await algorithm_module(name).run(job)
    return dict(result or {})
