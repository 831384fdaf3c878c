"""The house: every module of attn sits in one row of README's layout table,
and every import (at module level or inside a function) goes to its own row
or a row above it in the table, never below: data flows one way."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "attn"


def layers() -> dict[str, int]:
    """Module (or package) name -> its row in README's layout table, from the top."""
    table = (REPO / "README.md").read_text().split("## Layout", 1)[1].split("| part | modules | job |", 1)[1]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    return {name.removesuffix(".py").removesuffix("/"): depth
            for depth, row in enumerate(rows) for name in re.findall(r"`([\w/.]+)`", row.split("|")[2])}


def module_of(path: Path) -> str:
    """attn/x.py -> x; attn/board/server.py -> board (a package is one room)."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported(tree: ast.AST) -> list[tuple[str, int]]:
    """The attn modules a file imports, with the line of each import."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"attn.{a.name}" for a in node.names] if node.module == "attn" else [node.module]
        else:
            continue
        found += [(name.split(".")[1], node.lineno) for name in names if name.startswith("attn.")]
    return found


def test_every_module_is_in_the_layout_table_once():
    placed = layers()
    modules = {module_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert modules - set(placed) == set(), "modules README's layout table does not place"
    assert set(placed) - modules == set(), "the table names modules that do not exist"


def test_no_module_imports_one_in_a_row_below_it():
    placed = layers()
    downward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_of(path)
        if source == "__init__":
            continue
        for target, line in imported(ast.parse(path.read_text())):
            if target in placed and placed[target] > placed[source]:
                downward.append(f"{path.relative_to(REPO)}:{line} imports attn.{target}")
    assert downward == []
