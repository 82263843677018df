"""The README's promises: its quickstart and test command are what CI runs, word for word, the environment
the quickstart leaves is checked by CI, and its "API in brief" example runs as written (on the GPU where there is
one, else on the CPU)."""

from __future__ import annotations

import re

import pytest

from helpers.paths import REPO_ROOT

REPO = REPO_ROOT
README = REPO / "README.md"
CI = REPO / ".ci" / "run"
if not README.is_file():
    pytest.skip("README.md not in this copy of the tests", allow_module_level=True)


def _section_blocks(heading: str, lang: str) -> list:
    """The fenced code blocks of language ``lang`` in the README section ``## heading``."""
    text = README.read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README has no section '## {heading}'"
    return re.findall(rf"```{lang}\n(.*?)```", match.group(1), re.S)


def test_quickstart_and_test_command_are_what_ci_runs() -> None:
    """.ci/run runs the README's quickstart command and its test command unchanged, as lines of their own."""
    blocks = _section_blocks("Quickstart", "bash")
    assert len(blocks) >= 2, "the quickstart section has the install command and the test command"
    quickstart, test_command = blocks[0].strip(), blocks[1].strip()
    assert "\n" not in quickstart, "the quickstart is one command"
    assert test_command == "python -m pytest tests -q"
    ci_lines = [line.strip() for line in CI.read_text().splitlines()]
    assert quickstart in ci_lines
    assert test_command in ci_lines


def test_ci_checks_the_environment_the_quickstart_leaves() -> None:
    """The quickstart installs no package that cannot import (no --no-deps install), and .ci/run checks, after
    it, that diffusers' models import and pip check is clean."""
    quickstart = _section_blocks("Quickstart", "bash")[0].strip()
    assert "--no-deps" not in quickstart, "the quickstart installs every package with its dependencies"
    ci_lines = [line.strip() for line in CI.read_text().splitlines()]
    after = ci_lines[ci_lines.index(quickstart) + 1:]
    for check in ("pip install diffusers==0.42.1", 'python -c "from diffusers import QwenImageTransformer2DModel"',
                  "pip check"):
        assert check in after, f".ci/run does not run {check!r} after the quickstart"


def test_api_in_brief_runs_as_written() -> None:
    """The README's Python example executes without error and its own assertions hold."""
    (code,) = _section_blocks("API in brief", "python")
    exec(compile(code, "README.md (API in brief)", "exec"), {})
