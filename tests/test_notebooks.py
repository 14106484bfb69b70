"""The notebooks under notebooks/ execute in a real Jupyter kernel (nbclient + ipykernel),
each in under a minute, and the committed files carry their outputs (figures)."""

import json
import time

import nbformat
import pytest

from geomx.notebooks import NotebookFailed, execute_notebook, notebook_paths

from tests.helpers.paths import ROOT

NOTEBOOKS = notebook_paths(ROOT / "notebooks")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_in_a_kernel(path, tmp_path):
    start = time.perf_counter()
    done = execute_notebook(path, write=False, out_dir=tmp_path / "runs")
    print(f"\n{path.name}: {done.cells} code cells in {time.perf_counter() - start:.1f} s")
    assert done.cells >= 3
    assert any((tmp_path / "runs").iterdir())  # it made its own runs, where it was told


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_carries_its_outputs(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), "run `python -m geomx.notebooks run`"
    images = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "no figure in the committed outputs"
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert path.stat().st_size < 400_000  # small PNGs


def test_the_index_lists_every_notebook():
    index = (ROOT / "notebooks" / "README.md").read_text()
    for path in NOTEBOOKS:
        assert path.name in index
    assert "NETSTORM" in index and "scheduling" in index.lower()


@pytest.mark.slow
def test_a_failing_cell_reports_its_source_and_traceback(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("def f():\n    return 1 / 0\n\ny = f()"),
        nbformat.v4.new_code_cell("z = 2"),
    ])
    path = tmp_path / "bad.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(NotebookFailed) as e:
        execute_notebook(path)
    msg = str(e.value)
    assert "bad.ipynb: code cell 2 failed" in msg
    assert "y = f()" in msg and "ZeroDivisionError" in msg and "return 1 / 0" in msg
