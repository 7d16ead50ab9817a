"""The README's layer example runs as written, and every shape its comments state is the
shape the code gives (the README is the user's first contact: keep it true)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"
SHAPES = re.compile(r"#\s*(\(\d+(?:, \d+)*\)(?:, \(\d+(?:, \d+)*\))*)\s*$")


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _targets(line: str) -> list[str]:
    """The names an assignment line binds, left to right (``out, (h_n, c_n) = ...``)."""
    def names(node) -> list[str]:
        if isinstance(node, ast.Name):
            return [node.id]
        return [name for element in getattr(node, "elts", ()) for name in names(element)]

    return names(ast.parse(line.split("#")[0].strip()).body[0].targets[0])


def test_the_readme_layer_example_runs_and_its_commented_shapes_hold():
    if not README.exists():
        pytest.skip("README.md is not next to the tests (an installed copy)")
    blocks = _python_blocks(README.read_text())
    assert blocks, "README.md has no python example"
    checked = 0
    for block in blocks:
        namespace: dict = {}
        pending: list[str] = []
        for line in block.splitlines():
            pending.append(line)
            found = SHAPES.search(line)
            if not found or "=" not in line.split("#")[0]:
                continue
            exec("\n".join(pending), namespace)  # noqa: S102 - the README's own code
            pending = []
            expected = [tuple(int(v) for v in m.split(", ")) for m in re.findall(r"\(([\d, ]+)\)", found.group(1))]
            names = _targets(line)
            tensors = [namespace[n] for n in names if isinstance(namespace[n], torch.Tensor)]
            assert [tuple(t.shape) for t in tensors] == expected, line
            checked += 1
        exec("\n".join(pending), namespace)  # noqa: S102 - the rest of the block runs too
    assert checked >= 2  # the shape comments were found (a README edit that drops them fails here)
