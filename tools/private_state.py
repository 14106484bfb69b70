"""Count the places where one object reaches into another's state.

docs/architecture.md asks each module to talk to others through interfaces that say what
they mean. This script measures how far the package is from that, with two rules read
off the syntax tree of every module under ``geomx/``:

1. **Private access**: every ``x._name`` (read, write or call) whose ``x`` is not the
   bare name ``self`` or ``cls``. ``_name`` has one leading underscore; dunders such as
   ``x.__class__`` are not private. ``module._helper`` counts (a module's private name
   is private to it), as does ``from geomx.module import _helper`` (one site per name
   imported from a geomx module), and so does ``other._field`` inside a method of the very class
   that declares ``_field`` (``__eq__`` comparing two instances): a reader cannot tell
   from the syntax that ``other`` is of the same class, so the rule stays simple and
   such a site is either rewritten or counted. A standard-library function whose
   documented name has an underscore (``os._exit``) is public and does not count, nor
   does the one underscored attribute torch offers with no public spelling
   (:data:`LIBRARY_PUBLIC`, in geomx/torch only).
2. **Foreign public write**: an assignment ``x.name = ...`` / ``x.name += ...`` /
   ``x.name: T = ...`` whose ``x`` is not ``self``/``cls``, whose ``name`` is public,
   is declared by a class of another geomx module and by no class of this one. A
   class declares a field as ``self.name = ...`` in a method, as a class-body field
   or annotation, or in a ``__slots__`` tuple. A field made public still counts when
   a module other than its owner's writes it. The rule is an approximation, since it
   cannot see types: a module that declares a field of the same name on one of its
   own classes is trusted to be writing its own, and a name no geomx class declares
   (``sys.stdout``, an ``ssl.SSLContext`` option, an argparse namespace) is the
   public interface of a library object, not geomx state.

``python tools/private_state.py`` prints per-file counts and the total;
``--list`` prints every site as ``path:line: rule: expression``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWNER_NAMES = frozenset({"self", "cls"})
#: Standard-library functions whose documented public name starts with an underscore.
STDLIB_PUBLIC = frozenset({"os._exit", "sys._getframe"})
#: Underscored attributes of a library's objects that the library itself offers as the
#: way to ask (no public spelling exists), by the folder whose modules use that library:
#: torch's ``Tensor._version``, the in-place version counter autograd's own checks read
#: (geomx.torch uses it to see a gradient changed after it was sent).
LIBRARY_PUBLIC = {"geomx/torch/": frozenset({"_version"})}


@dataclass(frozen=True, slots=True)
class Site:
    """One place where a module touches another object's state."""

    path: str
    line: int
    rule: str  # "private" or "foreign-write"
    text: str


def _is_private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def _is_owner(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in OWNER_NAMES


def _from_geomx(node: ast.ImportFrom) -> bool:
    module = node.module or ""
    return node.level > 0 or module == "geomx" or module.startswith("geomx.")


def _declared_names(tree: ast.Module) -> set[str]:
    """Attribute names a class in this module declares for its own instances."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_owner(node.value) \
                and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    names.add(stmt.target.id)
                elif isinstance(stmt, ast.Assign):
                    for target in stmt.targets:
                        if isinstance(target, ast.Name):
                            names.add(target.id)
                            if target.id == "__slots__":
                                names.update(_slot_names(stmt.value))
    return names


def _slot_names(value: ast.expr) -> set[str]:
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return {value.value}
    return set()


def _write_targets(tree: ast.Module) -> list[ast.Attribute]:
    targets: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets.extend(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets.append(node.target)
    flat: list[ast.Attribute] = []
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets.extend(t.elts)
        elif isinstance(t, ast.Starred):
            targets.append(t.value)
        elif isinstance(t, ast.Attribute):
            flat.append(t)
    return flat


def scan_module(path: Path, root: Path, declared_elsewhere: set[str]) -> list[Site]:
    """Every site in one module that breaks rule 1 or rule 2; ``declared_elsewhere``
    holds the field names that classes of the other modules declare."""
    rel = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    sites: list[Site] = []
    library = frozenset().union(*(names for folder, names in LIBRARY_PUBLIC.items()
                                  if rel.startswith(folder)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr) \
                and not _is_owner(node.value) and ast.unparse(node) not in STDLIB_PUBLIC \
                and node.attr not in library:
            sites.append(Site(rel, node.lineno, "private", ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and _from_geomx(node):
            sites.extend(Site(rel, node.lineno, "private",
                              f"from {'.' * node.level}{node.module or ''} import {a.name}")
                         for a in node.names if _is_private(a.name))
    declared = _declared_names(tree)
    for target in _write_targets(tree):
        if _is_private(target.attr) or _is_owner(target.value):
            continue  # rule 1 already counted it, or the owner writes its own field
        if target.attr in declared or target.attr not in declared_elsewhere:
            continue
        sites.append(Site(rel, target.lineno, "foreign-write", ast.unparse(target)))
    sites.sort(key=lambda s: (s.line, s.rule, s.text))
    return sites


def scan(package: Path = ROOT / "geomx", root: Path = ROOT) -> list[Site]:
    """Every site under ``package``, sorted by file and line."""
    paths = sorted(package.rglob("*.py"))
    declared = {p: _declared_names(ast.parse(p.read_text())) for p in paths}
    sites: list[Site] = []
    for path in paths:
        elsewhere = set().union(*(names for p, names in declared.items() if p != path))
        sites.extend(scan_module(path, root, elsewhere))
    return sites


def per_file(sites: list[Site]) -> dict[str, int]:
    """Sites counted per module path, for files with at least one."""
    counts: dict[str, int] = {}
    for s in sites:
        counts[s.path] = counts.get(s.path, 0) + 1
    return counts


def report(sites: list[Site], listing: bool = False) -> str:
    """Per-file counts, largest first, then the totals per rule and overall."""
    lines: list[str] = []
    if listing:
        lines.extend(f"{s.path}:{s.line}: {s.rule}: {s.text}" for s in sites)
        lines.append("")
    counts = per_file(sites)
    for path, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{n:5d}  {path}")
    private = sum(1 for s in sites if s.rule == "private")
    lines.append(f"total {len(sites)} (private {private}, "
                 f"foreign-write {len(sites) - private})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print every site")
    parser.add_argument("package", nargs="?", default=str(ROOT / "geomx"),
                        help="package folder to scan (default: geomx/)")
    args = parser.parse_args(argv)
    package = Path(args.package).resolve()
    print(report(scan(package, package.parent), listing=args.list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
