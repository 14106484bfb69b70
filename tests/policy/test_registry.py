"""How a scenario's name finds a policy class (geomx/policy/registry.py): built-in
names, files, modules and installed plug-ins, each failure one line naming the policy,
and a user hook that raises named with where it raised (geomx/policy/guard.py)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from geomx.policy import Codec
from geomx.policy.guard import PolicyFailed
from geomx.policy.registry import PolicyError, policy_class, spec_of

from tests.policy.conftest import DGC_SPEC


def test_a_builtin_name_and_a_file_spec_find_their_classes(lab):
    assert policy_class("codec", "bsc").__name__ == "BiSparseCodec"
    cls = policy_class("codec", f"{lab / 'boom.py'}:Boom")
    assert issubclass(cls, Codec) and cls.__name__ == "Boom"
    # the spec travels with the class: its config() names the file every node loads
    assert spec_of(cls) == f"{lab / 'boom.py'}:Boom"
    assert cls(after=5).config() == {"type": f"{lab / 'boom.py'}:Boom", "after": 5}


def test_a_module_spec_and_an_installed_plugin_name(lab, monkeypatch):
    monkeypatch.syspath_prepend(str(lab))
    cls = policy_class("codec", "boom:Boom")
    assert cls.__module__ == "boom"
    entry = SimpleNamespace(name="lab-boom", value="boom:Boom")
    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group=None: [entry] if group == "geomx.policies" else [])
    assert policy_class("codec", "lab-boom") is cls
    sys.modules.pop("boom", None)


@pytest.mark.parametrize("spec, message", [
    ("broken.py:X", r"^codec policy '.*broken.py:X' failed to import: ModuleNotFoundError: "
                    r"No module named 'a_module_that_is_not_installed'$"),
    ("boom.py:Missing", r"^codec policy '.*boom.py:Missing': '.*boom.py' has no class 'Missing'$"),
    ("boom.py:NoEncode", r"^codec policy '.*boom.py:NoEncode': NoEncode does not implement "
                         r"encode \(required by geomx.policy.CodecPolicy\)$"),
    ("boom.py:NotACodec", r"^codec policy '.*boom.py:NotACodec': NotACodec is not a codec "
                          r"policy; subclass geomx.policy.CodecPolicy$"),
    ("nowhere.py:X", r"^codec policy '.*nowhere.py:X': no such file"),
    ("boom.py", r"name the class, as in 'file.py:Class'$"),
    ("no_such_pkg.mod:X", r"^codec policy 'no_such_pkg.mod:X': cannot import module"),
])
def test_each_bad_spec_is_one_line_naming_the_policy(lab, spec, message):
    target = f"{lab / spec.partition(':')[0]}:{spec.partition(':')[2]}" if ".py" in spec else spec
    if ":" not in spec:
        target = str(lab / spec)
    with pytest.raises(PolicyError, match=message) as info:
        policy_class("codec", target)
    assert "\n" not in str(info.value)


def test_an_unknown_bare_name_lists_the_builtins():
    with pytest.raises(PolicyError, match=r"unknown codec policy 'topk'; allowed: 'none', "
                                          r"'fp16'.*'file.py:Class'"):
        policy_class("codec", "topk")


def test_a_user_hook_that_raises_names_the_policy_the_hook_and_the_line(lab):
    cls = policy_class("codec", f"{lab / 'boom.py'}:Boom")
    codec = cls(after=0)
    with pytest.raises(PolicyFailed, match=r"^codec policy '.*boom.py:Boom' raised in encode\(\) "
                                           r"at boom.py:\d+: RuntimeError: top-k buffer overflow$"):
        codec.encode(0, np.ones(4, np.float32))


def test_builtin_classes_are_left_unwrapped():
    cls = policy_class("codec", "bsc")
    assert spec_of(cls) is None and "__geomx_guarded__" not in cls.__dict__
    user = policy_class("codec", DGC_SPEC)
    assert user.__dict__.get("__geomx_guarded__") is True
