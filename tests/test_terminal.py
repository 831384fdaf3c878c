"""What attn writes to a terminal obeys nothing in it (issue 46.8): a run or directory name holding an
escape sequence (a window title, clear screen) or a bidirectional override is shown escaped, by the one
function attn/cli writes through (attn.cli.common.say)."""

import ast
from pathlib import Path

from board_runs import write_run

from attn import cli
from attn.cli import common

HOSTILE = {
    "title\x1b]0;pwned\x07": "title\\x1b]0;pwned\\x07",
    "clear\x1b[2J\x1b[H": "clear\\x1b[2J\\x1b[H",
    "evil\u202egnp.exe": "evil\\u202egnp.exe",
    "csi\x9b31m\rback": "csi\\x9b31m\\rback",
}
OBEYED = ("\x1b", "\x07", "\u202e", "\x9b", "\r")


def test_attn_runs_shows_hostile_names_escaped_and_aligned(tmp_path, capsys):
    for name in HOSTILE:
        write_run(tmp_path / "runs" / name)
    (tmp_path / "runs" / "damaged\x1b[2J").mkdir()
    (tmp_path / "runs" / "damaged\x1b[2J" / "config.yaml").write_text("- not a mapping\n")
    assert cli.main(["runs", str(tmp_path / "runs")]) == 0
    out, err = capsys.readouterr()
    assert not any(c in out + err for c in OBEYED), (out, err)
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert sorted(rows) == sorted(HOSTILE.values())
    assert len({line.index("completed") for line in rows.values()}) == 1, "columns aligned as shown"
    assert "damaged\\x1b[2J" in err


def test_say_keeps_lines_and_tabs_and_escapes_every_other_control():
    assert common.terminal_text("a\tb\nc\x1b[2J\u202e\x00") == "a\tb\nc\\x1b[2J\\u202e\\x00"
    assert common.terminal_text(common.terminal_text("x\x1b")) == "x\\x1b"


def test_attn_cli_writes_only_through_say():
    """No print() or write() to a stream in attn/cli but say's own (and a progress bar's, of terminal_text)."""
    for path in sorted((Path(cli.__file__).parent).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                stream = (
                    isinstance(node.func, ast.Attribute)
                    and name == "write"
                    and any(s in ast.unparse(node.func.value) for s in ("stdout", "stderr", "bar"))
                )  # a stream or a progress bar, not a library function named write
                inside_say = path.name == "common.py" and name == "print" and _in_function(path, node, "say")
                escaped = bool(node.args) and getattr(getattr(node.args[0], "func", None), "id", "") == "terminal_text"
                assert not (name == "print" or stream) or inside_say or escaped, f"{path.name}:{node.lineno}: {name}()"


def _in_function(path: Path, node: ast.AST, function: str) -> bool:
    tree = ast.parse(path.read_text())
    for defined in ast.walk(tree):
        if isinstance(defined, ast.FunctionDef) and defined.name == function:
            return defined.lineno <= node.lineno <= (defined.end_lineno or defined.lineno)
    return False
