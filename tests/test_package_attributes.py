"""``import geomx`` gives access to every subpackage by attribute, as users write it
(``geomx.kv.create(...)``), without importing them all up front."""
from __future__ import annotations

import subprocess
import sys

import pytest


def test_subpackages_by_attribute_after_a_bare_import():
    code = (
        "import sys, geomx\n"
        "assert 'geomx.kv' not in sys.modules, 'import geomx imported the kvstore'\n"
        "assert callable(geomx.kv.create)\n"
        "assert geomx.experiment.run_scenario is not None and geomx.codec.decode is not None\n"
        "try:\n"
        "    geomx.no_such_part\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_part' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
        "assert not hasattr(geomx, '_private')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_missing_dependency_of_a_subpackage_is_not_hidden(monkeypatch, tmp_path):
    """A submodule that exists but fails to import raises its own error, not "no attribute"."""
    import geomx

    monkeypatch.setattr(geomx, "__path__", [*geomx.__path__, str(tmp_path)])
    (tmp_path / "broken_part.py").write_text("import module_that_does_not_exist_anywhere\n")
    with pytest.raises(ModuleNotFoundError, match="module_that_does_not_exist_anywhere"):
        geomx.broken_part
