"""The generated field reference of ``docs/scenario.md``: one table per section, from the
field tables themselves, so the docs list exactly what the parser accepts (a test checks
that the committed file is up to date)."""

from __future__ import annotations

import os
from pathlib import Path

from geomx.scenario.kinds import settings_of
from geomx.scenario.model import sections

__all__ = ["DOC_BEGIN", "DOC_END", "reference_markdown", "write_reference"]


DOC_BEGIN = "<!-- BEGIN GENERATED FIELD REFERENCE (python -m geomx.scenario --write-docs docs/scenario.md) -->"
DOC_END = "<!-- END GENERATED FIELD REFERENCE -->"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """Markdown tables of every section and setting (the generated part of docs/scenario.md)."""
    out: list[str] = []
    for spec in sections():
        header = f"[[{spec.key}]]" if spec.array else f"[{spec.key}]"
        out.append(f"### `{header}`")
        out.append("")
        doc = " ".join((spec.cls.__doc__ or "").split())
        if doc:
            out.append(doc)
            out.append("")
        out.append("| key | type | default | unit | meaning | allowed |")
        out.append("|---|---|---|---|---|---|")
        for row in settings_of(spec.cls):
            attr = f" (`{row.attr}`)" if row.attr != row.key else ""
            out.append(
                f"| `{row.key}`{attr} | {row.kind.type_name} | {_md_cell(row.default_text())} "
                f"| {row.kind.unit} | {_md_cell(row.doc)} | {_md_cell(row.kind.doc_allowed())} |")
        out.append("")
    return "\n".join(out)


def write_reference(doc_path: str | os.PathLike) -> None:
    """Replace the generated part of ``doc_path`` (between the markers) with :func:`reference_markdown`."""
    text = Path(doc_path).read_text(encoding="utf-8")
    start, end = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    Path(doc_path).write_text(text[:start] + "\n\n" + reference_markdown() + "\n" + text[end:], encoding="utf-8")

