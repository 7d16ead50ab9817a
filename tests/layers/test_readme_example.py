"""The README and the docs pages stay true: their Python examples run as written, and every
shape a comment states is the shape the code gives; the ``python -m lightning_rnn``
commands they show compose into valid configs; their relative links and anchors resolve.
(The README is the user's first contact: keep it true.)"""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
SHAPES = re.compile(r"#\s*(\(\d+(?:, \d+)*\)(?:, \(\d+(?:, \d+)*\))*)(?::.*)?\s*$")
COMMAND = re.compile(r"python -m lightning_rnn(?= |$)(.*)")

pytestmark = pytest.mark.skipif(not README.exists(), reason="README.md is not next to the tests (an installed copy)")


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _targets(line: str) -> list[str]:
    """The names an assignment line binds, left to right (``out, (h_n, c_n) = ...``)."""
    def names(node) -> list[str]:
        if isinstance(node, ast.Name):
            return [node.id]
        return [name for element in getattr(node, "elts", ()) for name in names(element)]

    return names(ast.parse(line.split("#")[0].strip()).body[0].targets[0])


def _run_checking_shapes(block: str) -> int:
    """Runs the block; after each line with a shape comment, checks the tensors it bound.
    Returns how many such lines there were."""
    namespace: dict = {}
    pending: list[str] = []
    checked = 0
    for line in block.splitlines():
        pending.append(line)
        found = SHAPES.search(line)
        if not found or "=" not in line.split("#")[0]:
            continue
        exec("\n".join(pending), namespace)  # noqa: S102 - the page's own code
        pending = []
        expected = [tuple(int(v) for v in m.split(", ")) for m in re.findall(r"\(([\d, ]+)\)", found.group(1))]
        tensors = [namespace[n] for n in _targets(line) if isinstance(namespace[n], torch.Tensor)]
        assert [tuple(t.shape) for t in tensors] == expected, line
        checked += 1
    exec("\n".join(pending), namespace)  # noqa: S102 - the rest of the block runs too
    return checked


def test_the_readme_layer_example_runs_and_its_commented_shapes_hold():
    blocks = _python_blocks(README.read_text())
    assert blocks, "README.md has no python example"
    checked = sum(_run_checking_shapes(block) for block in blocks)
    assert checked >= 2  # the shape comments were found (a README edit that drops them fails here)


@pytest.mark.parametrize("page", [p for p in PAGES if p != README], ids=lambda p: p.name)
def test_the_docs_python_examples_run_and_their_commented_shapes_hold(page):
    for block in _python_blocks(page.read_text()):
        _run_checking_shapes(block)


def _commands(text: str) -> list[list[str]]:
    """The overrides of every ``python -m lightning_rnn ...`` command in the page's bash
    blocks and inline code (continuation lines joined, comments and flags such as
    ``--cfg job`` dropped)."""
    pieces = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    pieces = [line for block in pieces for line in block.replace("\\\n", " ").splitlines()]
    pieces += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))]
    commands = []
    for piece in pieces:
        found = COMMAND.search(piece)
        if found and "<" not in found.group(1) and "/path/to/" not in found.group(1):  # not a user's own folder
            args = shlex.split(found.group(1), comments=True)
            overrides = [a for a in args if "=" in a and not a.startswith("-")]
            if "-m" in args or "--multirun" in args:  # a sweep: each trial composes with the first values
                overrides = [_first_trial(a) for a in overrides]
            commands.append(overrides)
    return commands


def _first_trial(override: str) -> str:
    """``key=a,b,c`` (a sweep) as ``key=a``; other overrides as they are."""
    key, value = override.split("=", 1)
    if "," in value and not value.startswith(("[", "'", '"', "{")) and "(" not in value:
        return f"{key}={value.split(',')[0]}"
    return override


def test_the_commands_shown_compose_into_valid_configs():
    from hydra import compose, initialize_config_dir

    from lightning_rnn.cli import config_dir

    commands = [c for page in PAGES for c in _commands(page.read_text())]
    assert len(commands) >= 5 and ["task=benchmark", "bench=smoke"] in commands
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        for overrides in commands:
            # hydra.* settings (launchers, sweepers) are in the config Hydra itself composes
            cfg = compose("config", overrides=overrides, return_hydra_config=any(o.startswith("hydra") for o in overrides))
            for override in overrides:  # each key=value made it into the config as given
                key, value = override.split("=", 1)
                if "." in key:
                    assert _same(cfg_select(cfg, key), value.strip("'\"")), override


def _same(got, given: str) -> bool:
    """The config's value is the one given (numbers compared as numbers: 1e-3 is 0.001)."""
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        try:
            return float(given) == got
        except ValueError:
            return False
    return str(got) == given


def cfg_select(cfg, key: str):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, throw_on_missing=False)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target}"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", linked.read_text(), flags=re.S), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: {target}"
