"""No function in llm_inference longer than MAX_LINES: a longer one (the HTTP load's 108-line rate runner was one)
does several things a reader must hold at once, and two of them drift apart unseen."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "llm_inference"
MAX_LINES = 60


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """`path:line name (N lines)` of every function or method under `root` whose def, decorators included, spans more
    than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{first} {node.name} ({lines} lines)")
    return found


def test_no_llm_inference_function_is_longer_than_the_limit():
    assert long_functions(PACKAGE) == []


def test_the_check_finds_a_long_method_with_its_decorator(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES - 1))  # fits: exactly MAX_LINES lines
    (package / "short.py").write_text(f"class A:\n    def fits(self):\n{body}")
    (package / "long.py").write_text(f"class A:\n    @staticmethod\n    def over():\n{body}")
    assert long_functions(package) == [f"pkg/long.py:2 over ({MAX_LINES + 1} lines)"]
