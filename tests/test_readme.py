"""README.md stays a guide a newcomer can trust.

Its layer sketch is pyproject.toml's import-linter contract, line for line, so the
picture cannot drift from what `lint-imports` enforces; its Layout names every package
of geomx/ and nothing that is not there; it stays short enough to read in one sitting;
and every relative link in it (and in the guide and benchmark pages it sends readers to)
leads to a file and, for a `#fragment`, to a heading of that file.
docs/architecture.md's "Layers" sketch is held to the same contract.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
LINKED_PAGES = [README, ROOT / "docs" / "guide.md", ROOT / "docs" / "benchmarks.md"]
MAX_README_LINES = 250

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _contract_layers() -> list[list[str]]:
    """The layers contract, top to bottom, each layer's names without `geomx.`."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    return [[n.strip().removeprefix("geomx.") for n in layer.split("|")] for layer in layers]


def _section(text: str, heading: str) -> list[str]:
    """The lines under `heading` (an exact line) up to the next heading of its level or above."""
    lines = text.splitlines()
    assert heading in lines, f"no {heading!r} heading"
    start = lines.index(heading) + 1
    level = len(heading) - len(heading.lstrip("#"))
    out: list[str] = []
    in_fence = False
    for line in lines[start:]:
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and re.match(rf"^#{{1,{level}}} ", line):
            break
        out.append(line)
    return out


def _first_fenced_block(lines: list[str]) -> list[str]:
    opens = [i for i, line in enumerate(lines) if FENCE.match(line)]
    assert len(opens) >= 2, "no fenced block in the section"
    return lines[opens[0] + 1:opens[1]]


def _without_fenced_blocks(text: str) -> list[str]:
    out: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            out.append(line)
    return out


def _geomx_top_level() -> set[str]:
    """Modules and packages directly under geomx/ (what the layers contract places)."""
    return {p.stem for p in (ROOT / "geomx").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__")
            or (p.is_dir() and (p / "__init__.py").exists())}


def _heading_anchors(path: Path) -> set[str]:
    """GitHub's anchor for each heading: lower case, punctuation dropped, spaces to '-'."""
    anchors = set()
    for line in _without_fenced_blocks(path.read_text()):
        m = re.match(r"^#+ (.*)$", line)
        if m:
            title = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(title.replace(" ", "-"))
    return anchors


def test_readme_layer_sketch_is_the_contract():
    block = _first_fenced_block(_section(README.read_text(), "### Layers"))
    sketch = [[n.strip() for n in line.split("|")] for line in block if line.strip()]
    assert sketch == _contract_layers(), (
        "README.md's layer sketch must list pyproject.toml's layers, top to bottom, one line "
        "per layer, names without 'geomx.' joined by ' | '")


def test_architecture_layer_sketch_is_the_contract():
    block = _first_fenced_block(_section(ARCHITECTURE.read_text(), "## Layers (imports only point downwards)"))
    # A layer starts at the first column; indented lines continue its description.
    layer_lines = [line for line in block if line.strip() and not line[0].isspace()]
    sketch = [[n.strip().removesuffix("/").removesuffix(".py")
               for n in re.split(r"\s{2,}", line)[0].split("|")] for line in layer_lines]
    assert sketch == _contract_layers()


def test_readme_layout_names_every_package_and_only_real_paths():
    rows = [line for line in _section(README.read_text(), "## Layout")
            if line.startswith("| `")]
    paths = [p for row in rows for p in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert paths, "no paths in README.md's Layout table"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == [], f"README.md's Layout names paths that do not exist: {missing}"
    named = {p.split("/")[1].removesuffix(".py") for p in paths
             if p.startswith("geomx/") and len(p.split("/")) > 1 and p.split("/")[1]}
    unnamed = _geomx_top_level() - named
    assert unnamed == set(), f"add these to README.md's Layout: {sorted(unnamed)}"


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail into docs/"


def test_relative_links_lead_to_files_and_headings():
    broken = []
    for page in LINKED_PAGES:
        for line in _without_fenced_blocks(page.read_text()):
            for target in LINK.findall(line):
                if URL_SCHEME.match(target):
                    continue
                file_part, _, fragment = target.partition("#")
                dest = (page.parent / file_part).resolve() if file_part else page
                if not dest.exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
                elif fragment and dest.suffix == ".md" and fragment not in _heading_anchors(dest):
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == [], "broken links:\n" + "\n".join(broken)
