"""The README's examples run as written: its Python blocks in order as one session, its shell blocks'
``fxcost`` lines one by one, from a copy of the project root (``../shared/data`` is the measurement
data, as beside a checkout).

A block that cannot run here is marked by an HTML comment on the line before it,
``<!-- no-test: REASON -->`` (a GPU, a long run); every other ``bash`` and ``python`` block runs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RUN = ("bash", "python")  # the languages of blocks that run; others (yaml, diagrams) are shown only
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*no-test:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the no-test reason, if the block is marked


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of ``text``, each with the no-test reason on the line before it."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = _MARKER.match(lines[i - 1].strip()) if i else None
        blocks.append(Block(fence.group(1), i + 1, "\n".join(lines[i + 1 : end]), marker and marker.group(1)))
        i = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
SHELL = [b for b in BLOCKS if b.lang == "bash" and b.skip is None]


def shell_commands(code: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped."""
    return [
        shlex.split(line, comments=True) for line in code.replace("\\\n", " ").splitlines() if line.strip()
    ]


@pytest.fixture
def project_root(tmp_path: Path, data_dir: Path) -> Path:
    """A directory that looks like the project root (its top-level entries linked), with the
    measurement data at ``../shared/data``: outputs the examples write land here, not in the repo."""
    root = tmp_path / "project"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv"):
            (root / entry.name).symlink_to(entry)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(data_dir)
    return root


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg", COLUMNS="120")
    env.pop("FXCOST_DEVICES", None)
    return env


def test_every_block_that_does_not_run_says_why() -> None:
    assert {b.lang for b in BLOCKS} >= set(RUN)
    marked = [b for b in BLOCKS if b.skip is not None]
    assert all(b.lang in RUN and b.skip for b in marked), (
        "a no-test marker without a reason, or on a shown block"
    )
    assert len(marked) <= 6, "keep the examples that cannot run here few"
    for block in SHELL:
        for command in shell_commands(block.code):
            assert command[0] == "fxcost", f"README line {block.line}: {command} is not an fxcost command"


def test_shell_lines_are_split_as_a_shell_would() -> None:
    code = "fxcost simulate a.json --cluster 4xT4 \\\n    --batch 16   # a comment\n\nfxcost devices"
    assert shell_commands(code) == [["fxcost", "simulate", "a.json", "--cluster", "4xT4", "--batch", "16"],
                                    ["fxcost", "devices"]]  # fmt: skip
    blocks = readme_blocks("text\n<!-- no-test: needs a GPU -->\n```bash\nfxcost x\n```\n```python\n1\n```")
    assert [(b.lang, b.line, b.code, b.skip) for b in blocks] == [
        ("bash", 3, "fxcost x", "needs a GPU"),
        ("python", 6, "1", None),
    ]


@pytest.mark.slow
def test_the_python_examples_run_in_order(project_root: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("pandas")
    pytest.importorskip("onnx")
    blocks = [b for b in BLOCKS if b.lang == "python" and b.skip is None]
    # Each block is compiled under its README line, so a failure names where it is.
    script = "\n".join(f"exec(compile({b.code!r}, 'README.md line {b.line}', 'exec'))" for b in blocks)
    done = subprocess.run([sys.executable, "-c", script], cwd=project_root, env=_env(), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL, ids=[f"line{b.line}" for b in SHELL])
def test_the_shell_examples_run(block: Block, project_root: Path) -> None:
    for command in shell_commands(block.code):
        if command[1:2] == ["profile"] and command[2].endswith(".json"):
            pytest.importorskip("transformers")
        done = subprocess.run([sys.executable, "-m", *command], cwd=project_root, env=_env(),
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, f"README line {block.line}: {shlex.join(command)}\n{done.stderr[-3000:]}"
