"""The policies a scenario names: ``[sync] algorithm``, ``[sched] policy``,
``[topology] kind`` and ``[codec] type``, and their ``[<section>.options]`` tables.

A name is a built-in (``"fsa"``, ``"bsc"``, ``"hips"``) or a user policy found like
``[training] program``: ``"lab/ssp.py:BoundedStaleness"`` next to the scenario file
(made absolute here, so every node of a job -- emulated, spawned by ``geomx run
--runtime real`` or ``geomx launch``, or started by hand with ``geomx node`` -- reads the
same file from the resolved scenario), ``"lab.ssp:BoundedStaleness"``, or an installed
``geomx.policies`` plug-in (:mod:`geomx.policy.registry`).

Each user policy is imported and its options are checked exactly once, when the scenario
loads (:func:`check_policies`): a file that does not import, a class missing a method,
an unknown option or one of the wrong type is a :class:`ScenarioError` of one line that
names the policy and the field, before any node starts (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from geomx.scenario.errors import ScenarioError

__all__ = ["POLICY_FIELDS", "PolicyField", "resolve_policy_spec", "resolve_policies",
           "check_policies", "is_user_spec", "is_user_policy", "options_dict"]


@dataclasses.dataclass(frozen=True)
class PolicyField:
    """Where a scenario names a policy of one kind."""

    kind: str        # geomx.policy.registry.KINDS
    section: str     # the Scenario attribute and TOML section
    key: str         # the key holding the name


POLICY_FIELDS: tuple[PolicyField, ...] = (
    PolicyField("sync", "sync", "algorithm"),
    PolicyField("sched", "sched", "policy"),
    PolicyField("topology", "topology", "kind"),
    PolicyField("codec", "codec", "type"),
)


@functools.cache
def _builtin_names(field: PolicyField) -> tuple[str, ...]:
    from geomx.scenario.kinds import setting_by_key
    from geomx.scenario.model import Scenario

    kind = setting_by_key(type(getattr(Scenario(), field.section)))[field.key].kind
    return tuple(getattr(kind, "options", ()))


def is_user_spec(field: PolicyField, spec: str) -> bool:
    """Whether ``spec`` names a user policy rather than a built-in one."""
    return spec not in _builtin_names(field)


def is_user_policy(kind: str, spec: str) -> bool:
    """Whether ``spec``, a name for a policy of ``kind``, is a user policy."""
    return is_user_spec(next(f for f in POLICY_FIELDS if f.kind == kind), spec)


def resolve_policy_spec(spec: str, base_dir: Path | None) -> str:
    """``"lab/ssp.py:Cls"`` next to the scenario file becomes an absolute path; module
    names, plug-in names and absolute paths stay as they are."""
    where, sep, cls = spec.rpartition(":")
    if not sep or not where.endswith(".py") or base_dir is None or Path(where).is_absolute():
        return spec
    candidate = base_dir / where
    try:
        return f"{candidate.resolve()}:{cls}" if candidate.exists() else spec
    except OSError:
        return spec


def resolve_policies(s: Any, base_dir: Path | None) -> Any:
    """``s`` with every user policy file made absolute (see the module docstring)."""
    changes = {}
    for field in POLICY_FIELDS:
        section = getattr(s, field.section)
        spec = getattr(section, field.key)
        if is_user_spec(field, spec):
            resolved = resolve_policy_spec(spec, base_dir)
            if resolved != spec:
                changes[field.section] = dataclasses.replace(section, **{field.key: resolved})
    return dataclasses.replace(s, **changes) if changes else s


def options_dict(section: Any) -> dict[str, Any]:
    """A section's ``[<section>.options]`` as a plain dict (arrays as lists)."""
    from geomx.scenario.kinds import OptionsTable

    return OptionsTable().emit(section.options)


def check_policies(s: Any) -> None:
    """Import every user policy the scenario names and check its options (one line each)."""
    for field in POLICY_FIELDS:
        section = getattr(s, field.section)
        spec = getattr(section, field.key)
        options = options_dict(section)
        if field.kind == "codec":
            _check_codec(spec, options, field)
        elif is_user_spec(field, spec):
            _check_user(field, spec, options)
        elif options:
            _check_builtin_options(field, spec, options)


def _check_user(field: PolicyField, spec: str, options: dict[str, Any]) -> None:
    from geomx.policy.options import OptionsError, options_from_table
    from geomx.policy.registry import PolicyError, describe_spec, policy_class

    try:
        cls = policy_class(field.kind, spec)
    except PolicyError as e:
        raise ScenarioError(str(e), path=f"{field.section}.{field.key}", value=spec) from None
    try:
        built = options_from_table(cls.Options, options, policy=describe_spec(field.kind, spec),
                                   where=f"{field.section}.options")
    except OptionsError as e:
        raise ScenarioError(str(e), path=f"{field.section}.options") from None
    try:  # built once here, so a constructor that cannot take its options fails at load
        cls(built)
    except Exception as e:
        raise ScenarioError(
            f"{describe_spec(field.kind, spec)}: {cls.__name__}({type(built).__name__}(...)) "
            f"raised {type(e).__name__}: {e}; a policy's __init__ takes its options "
            "(def __init__(self, options=None): super().__init__(options)) or is not written",
            path=f"{field.section}.{field.key}", value=spec) from None


def _check_builtin_options(field: PolicyField, spec: str, options: dict[str, Any]) -> None:
    from geomx.policy.options import OptionsError, options_from_table
    from geomx.policy.registry import BUILTIN, describe_spec, policy_class

    if spec in BUILTIN[field.kind]:
        cls = policy_class(field.kind, spec)
        try:
            options_from_table(cls.Options, options, policy=describe_spec(field.kind, spec),
                               where=f"{field.section}.options")
        except OptionsError as e:
            raise ScenarioError(str(e), path=f"{field.section}.options") from None
        return
    first = sorted(options)[0]
    raise ScenarioError(f"{field.section}.{field.key} = {spec!r} is built in and reads the keys "
                        f"of [{field.section}], not [{field.section}.options]; allowed there: "
                        "the options of a user policy", path=f"{field.section}.options.{first}",
                        value=first)


def _check_codec(spec: str, options: dict[str, Any], field: PolicyField) -> None:
    """A codec's options are its constructor parameters (``params``); building it once
    here checks their values too."""
    from geomx.codec import create_codec
    from geomx.policy.options import OptionsError, params_from_table
    from geomx.policy.registry import PolicyError, describe_spec

    user = is_user_spec(field, spec)
    if not user and not options:
        return
    label = describe_spec("codec", spec)
    try:
        cls = type(create_codec(spec)) if user else None
    except PolicyError as e:
        raise ScenarioError(str(e), path="codec.type", value=spec) from None
    except ValueError as e:  # the constructor refused its defaults
        raise ScenarioError(f"{label}: {e}", path="codec.type", value=spec) from None
    if cls is None:
        from geomx.codec.registry import codec_class

        cls = codec_class(spec)
    try:
        values = params_from_table(cls, options, policy=label, where="codec.options")
    except OptionsError as e:
        raise ScenarioError(str(e), path="codec.options") from None
    try:
        cls(**values)
    except Exception as e:  # a user constructor: whatever it raises is reported in one line
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ScenarioError(f"{label}: codec.options: {message}", path="codec.options") from None
