"""A user policy that raises names itself: its hooks' errors become one line.

:func:`geomx.policy.registry.policy_class` passes every user class through
:func:`guard_class` once. Each hook of the kind's API that the class writes (a method of
the base class it overrides: ``encode``, ``codec_for``, ``global_side``, ...) is wrapped
so that an exception it raises becomes a :class:`PolicyFailed` whose message is one
line: the policy, the hook, where in the user's file it raised, and the error. The node
running it stops with that error and the job ends with one line naming the node
(docs/extending.md, "When a policy raises"), in the emulator and over sockets alike.

Exceptions a hook raises on purpose to say "bad input" (``CodecError`` for a payload
that does not decode) and :class:`PolicyFailed` itself pass through unchanged, as does
anything that is not an ``Exception`` (cancellation). Built-in classes are never
wrapped, so their behaviour and event logs are exactly what they were.
"""

from __future__ import annotations

import functools
import inspect
import os
import traceback
from typing import Any, Callable

__all__ = ["PolicyFailed", "guard_class"]

#: Marks a class whose hooks are wrapped (wrapping twice would name the policy twice).
_GUARDED = "__geomx_guarded__"
#: Private hooks of the codec API a user codec writes (decoders are classmethods).
_PRIVATE_HOOKS = ("_decode_cpu", "_decode_cuda")


class PolicyFailed(RuntimeError):
    """A user policy's hook raised; the message is one line naming the policy."""


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {os.path.basename(last.filename)}:{last.lineno}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _wrap(fn: Callable[..., Any], label: str, hook: str,
          passthrough: tuple[type[BaseException], ...],
          then: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    def fail(exc: Exception) -> PolicyFailed:
        return PolicyFailed(f"{label} raised in {hook}(){_where(exc)}: {_one_line(exc)}")

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except passthrough:
                raise
            except Exception as exc:
                raise fail(exc) from None
        return call_async

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except passthrough:
            raise
        except Exception as exc:
            raise fail(exc) from None
        return then(result) if then is not None else result
    return call


def guard_class(cls: type, base: type, label: str,
                passthrough: tuple[type[BaseException], ...] = (),
                makes: dict[str, type] | None = None) -> type:
    """Wrap, in place, the hooks of ``base`` that user class ``cls`` writes (see the
    module docstring); ``label`` names the policy in messages. ``makes``: hooks that
    build another object of the policy (a sync algorithm's ``global_side`` builds a
    ``GlobalSide``), whose class is guarded in turn when it is first built. Returns
    ``cls``."""
    if cls.__dict__.get(_GUARDED) or cls.__module__.startswith("geomx."):
        return cls
    makes = makes or {}
    keep = (PolicyFailed, *passthrough)
    for name in dir(base):
        if name.startswith("__") or (name.startswith("_") and name not in _PRIVATE_HOOKS):
            continue
        ours = inspect.getattr_static(base, name, None)
        for owner in cls.__mro__:
            if owner is base or issubclass(base, owner):
                break
            theirs = owner.__dict__.get(name)
            if theirs is None:
                continue
            then = None
            if name in makes:
                made = makes[name]

                def then(obj: Any, made: type = made) -> Any:
                    guard_class(type(obj), made, label, passthrough)
                    return obj
            if isinstance(theirs, classmethod):
                wrapped: Any = classmethod(_wrap(theirs.__func__, label, name, keep))
            elif isinstance(theirs, staticmethod):
                wrapped = staticmethod(_wrap(theirs.__func__, label, name, keep))
            elif inspect.isfunction(theirs) and callable(ours):
                wrapped = _wrap(theirs, label, name, keep, then)
            else:
                break
            setattr(cls, name, wrapped)  # on cls even when a user base class wrote it
            break
    setattr(cls, _GUARDED, True)
    return cls
