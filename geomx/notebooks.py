"""Execute the notebooks under notebooks/ in a real Jupyter kernel; keep their outputs.

    python -m geomx.notebooks run                  # every notebook, outputs written back
    python -m geomx.notebooks run notebooks/codecs.ipynb --no-write   # check only

Why a kernel and not `exec` of the code cells: a notebook is what a reader runs in
Jupyter, with IPython's display of the value of a cell's last line (figures, tables),
its working directory and its own process; `exec` checks none of that. nbclient drives
an ipykernel exactly as Jupyter does. With `--write` (the default for `run`) the
outputs go back into the .ipynb, so the committed notebooks show their figures on a
code host; figures are PNGs at a modest resolution to keep the repository small.

Each notebook writes its runs under $GEOMX_NOTEBOOK_OUT (a temporary folder here) and
finds the scenarios through $GEOMX_ROOT (this checkout), both set for the kernel.
A cell that raises fails with the notebook, the cell's number, its source and the
kernel's traceback (`NotebookFailed`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
#: Seconds a single cell may run before the notebook fails.
CELL_TIMEOUT_S = 300


class NotebookFailed(RuntimeError):
    """A notebook cell raised (or timed out); the message has the cell and traceback."""


@dataclass
class Executed:
    path: Path
    seconds: float
    cells: int


def notebook_paths(root: Path = NOTEBOOK_DIR) -> list[Path]:
    return sorted(p for p in root.glob("*.ipynb") if not p.name.startswith("."))


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def execute_notebook(
    path: str | os.PathLike,
    *,
    write: bool = False,
    out_dir: str | os.PathLike | None = None,
    timeout_s: int = CELL_TIMEOUT_S,
) -> Executed:
    """Run every cell of `path` in a fresh python3 kernel started in the notebook's
    folder. `write` saves the executed notebook (outputs included) over `path`.
    `out_dir` is where the notebook's runs go (default: a temporary folder, removed)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="geomx-nb-") as tmp:
        env = dict(os.environ)
        env["GEOMX_ROOT"] = str(ROOT)
        env["GEOMX_NOTEBOOK_OUT"] = str(out_dir or Path(tmp) / "runs")
        # the kernel imports this checkout's geomx, whatever is installed
        paths = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        start = time.perf_counter()
        try:
            client.execute(env=env)
        except (CellExecutionError, CellTimeoutError) as exc:
            raise NotebookFailed(_failure_message(path, nb, exc)) from None
        seconds = time.perf_counter() - start
    nb.metadata.setdefault("geomx", {})["executed_seconds"] = round(seconds, 1)
    if write:
        nbformat.write(nb, path)
    return Executed(path, seconds, sum(c.cell_type == "code" for c in nb.cells))


def _failure_message(path: Path, nb, exc: Exception) -> str:
    """The failing cell (number and source) and the kernel's traceback."""
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    failing = None
    for number, cell in enumerate(code_cells, 1):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                failing = (number, cell)
    if failing is None:  # a timeout: the first cell without outputs after executed ones
        for number, cell in enumerate(code_cells, 1):
            if cell.get("execution_count") is None:
                failing = (number, cell)
                break
    head = f"{path.name}: code cell {failing[0] if failing else '?'} failed"
    source = failing[1].source if failing else "(unknown cell)"
    tb = ""
    if failing:
        for out in failing[1].get("outputs", []):
            if out.get("output_type") == "error":
                tb = _strip_ansi("\n".join(out.get("traceback", [])))
    return f"{head}\n--- source ---\n{source}\n--- traceback ---\n{tb or _strip_ansi(str(exc))}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geomx.notebooks",
                                     description="Execute notebooks in a Jupyter kernel.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute notebooks (default: all under notebooks/) and "
                                     "write their outputs back")
    run.add_argument("notebooks", nargs="*", help="notebook files (default: notebooks/*.ipynb)")
    run.add_argument("--no-write", dest="write", action="store_false",
                     help="only check that they run; leave the files alone")
    run.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.notebooks] or notebook_paths()
    failed = 0
    for p in paths:
        try:
            done = execute_notebook(p, write=args.write, timeout_s=args.timeout)
        except NotebookFailed as exc:
            failed += 1
            print(f"FAILED {exc}", file=sys.stderr)
            continue
        print(f"{done.path.name}: {done.cells} code cells in {done.seconds:.1f} s"
              f"{' (outputs written)' if args.write else ''}")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
