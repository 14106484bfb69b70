"""The notebooks under notebooks/ run top to bottom (code cells executed in order)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("GEOMX_ROOT", str(path.parent.parent))
    monkeypatch.setenv("GEOMX_NOTEBOOK_OUT", str(tmp_path / "runs"))
    nb = json.loads(path.read_text())
    ns: dict = {}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), ns)
    assert ns["rows"][0][5] < ns["rows"][1][5]  # HiPS sends fewer WAN bytes per iteration


def test_there_is_a_notebook():
    assert NOTEBOOKS
