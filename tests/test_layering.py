"""The house: every module of attn sits in one row of the layout table (docs/layout.md), and every import (at module
level or inside a function, by dotted module name) goes to a row below its own, or within its own row to a
module listed before it: data flows one way, between packages and inside each. And a public name says one thing:
no two modules define it, but for the twins named in SAME_ON_PURPOSE."""

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "attn"


def layout() -> dict[str, tuple[int, int]]:
    """Dotted module -> (its row in the layout table, docs/layout.md, its place in the row)."""
    table = (REPO / "docs" / "layout.md").read_text().split("| package | modules | job |", 1)[1]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    placed = {}
    for depth, row in enumerate(rows):
        package = re.findall(r"`([\w.]+)`", row.split("|")[1])
        for place, name in enumerate(re.findall(r"`([\w.]+)`", row.split("|")[2])):
            placed[name if name.startswith("attn") else f"{package[0]}.{name}"] = (depth, place)
    return placed


def dotted(path: Path) -> str:
    """attn/model/fast.py -> attn.model.fast; attn/board/__init__.py -> attn.board."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {dotted(p): p for p in PACKAGE.rglob("*.py")}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every test here (the tests only read it)."""
    return ast.parse(path.read_text())


def imported(tree: ast.AST) -> list[tuple[str, int]]:
    """The attn modules a file imports (a name imported from a package counts as its module if it is one)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names
            ]
        else:
            continue
        found += [(name, node.lineno) for name in names if name in MODULES]
    return found


def test_every_module_is_in_the_layout_table_once():
    placed = layout()
    packages = {m for m in MODULES if MODULES[m].name == "__init__.py"}
    assert set(MODULES) - packages - {"attn"} - set(placed) == set(), "modules docs/layout.md's table does not place"
    assert set(placed) - set(MODULES) == set(), "the table names modules that do not exist"


def test_no_module_imports_one_above_it():
    placed = layout()
    upward = []
    for source, path in sorted(MODULES.items()):
        if source not in placed:
            continue
        for target, line in imported(parsed(path)):
            if target in placed and target != source and placed[target] >= placed[source]:
                upward.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert upward == []


def test_the_layering_check_sees_an_import_inside_a_package():
    placed = layout()
    assert placed["attn.model.pairs"] < placed["attn.model.head"] < placed["attn.model.fast"]
    assert ("attn.model.pairs", 1) in imported(ast.parse("from attn.model import pairs"))


def test_every_folder_of_attn_is_a_package():
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    assert sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()) == []


# Names a module defines on purpose as another does: the textbook model is the fast model's twin, held to it
# function by function, and the one-run loop the stacked loop's; each command module adds its own commands
# to the one parser.
SAME_ON_PURPOSE = {
    "forward": {"attn.model.fast", "attn.model.reference"},
    "backward": {"attn.model.fast", "attn.model.reference"},
    "loss_and_grads": {"attn.model.fast", "attn.model.reference"},
    "train": {"attn.train.loop", "attn.train.reference_loop"},
    "add_commands": {"attn.cli.training", "attn.cli.sweeps", "attn.cli.views"},
}


@functools.cache
def public_names() -> dict[str, set[str]]:
    """Public top-level function or class name -> the modules defining it."""
    defined: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for node in parsed(path).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith(
                "_"
            ):
                defined.setdefault(node.name, set()).add(module)
    return defined


def test_no_public_name_is_defined_in_two_modules():
    defined = public_names()
    twice = {
        name: modules for name, modules in defined.items() if len(modules) > 1 and modules != SAME_ON_PURPOSE.get(name)
    }
    assert twice == {}
    assert all(defined[name] == modules for name, modules in SAME_ON_PURPOSE.items())
