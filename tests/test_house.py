"""The house rules the build keeps beyond the layers (import-linter) and
lint: no class grows past what one reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 500
"""A class this long is doing two jobs: split it (issue 38)."""


def class_lengths() -> dict[str, int]:
    lengths: dict[str, int] = {}
    for folder in ("protocol", "reducers", "server"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    name = f"{path.relative_to(ROOT)}:{node.name}"
                    lengths[name] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_class_is_longer_than_a_reader_takes_in() -> None:
    lengths = class_lengths()
    assert len(lengths) > 100  # it read the tree
    too_long = {name: n for name, n in lengths.items() if n >= MAX_CLASS_LINES}
    assert too_long == {}
