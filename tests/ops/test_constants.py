"""The formats' facts have one home per language: qwen_resnorm_fp4/constants.py and csrc/formats.h, equal to
each other and to torch's own float8_e4m3fn, and no other module writes them as literals."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from qwen_resnorm_fp4 import constants as c
from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
PACKAGE = ROOT / "qwen_resnorm_fp4"
CSRC = ROOT / "csrc"


def _cpp_constants() -> dict:
    text = (CSRC / "formats.h").read_text()
    return {name: float(value) for name, value in re.findall(r"constexpr float (\w+) = ([0-9.]+)f;", text)}


def test_python_and_cpp_state_the_same_maxima():
    assert _cpp_constants() == {"kE4m3Max": c.E4M3_MAX, "kE2m1Max": c.E2M1_MAX}


def test_the_maxima_are_the_formats_own():
    assert c.E4M3_MAX == torch.finfo(torch.float8_e4m3fn).max
    assert c.E2M1_MAX == max(c.E2M1_VALUES)
    assert c.FP4_AMAX_SCALE == c.E4M3_MAX * c.E2M1_MAX


@pytest.mark.parametrize("value,ok", [(1.0, True), (c.FLT_MIN_NORMAL, True), (c.FLT_MAX, True),
                                      (c.FLT_MIN_NORMAL / 2, False), (0.0, False), (-1.0, False),
                                      (float("inf"), False), (float("nan"), False)])
def test_fp8_input_scale_rule_on_floats_and_tensors(value, ok):
    assert bool(c.is_fp8_input_scale(value)) is ok
    assert bool(c.is_fp8_input_scale(torch.tensor([value], dtype=torch.float32))) is ok


def _numeric_literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            yield node.lineno, node.value


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py") if p.name != "constants.py"),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_writes_the_maxima_as_literals(path):
    """448 (E4M3) and 448 * 6 are written only in constants.py (6 alone is too common a number to scan for:
    the C++ side and the reviews keep it)."""
    found = [(line, v) for line, v in _numeric_literals(path) if v in (448, 2688)]
    assert not found, f"{path.name} writes a format maximum as a literal at lines {found}: import it from constants"


def test_no_cpp_source_writes_the_maxima_as_literals():
    pattern = re.compile(r"(?<![\w.])(448|6)\.0f\b|<448\b")
    for path in sorted(CSRC.glob("*")):
        if path.name == "formats.h" or path.suffix not in (".h", ".cuh", ".cu", ".cpp"):
            continue
        code = "\n".join(line.split("//")[0] for line in path.read_text().splitlines())
        assert not pattern.search(code), f"{path.name} writes a format maximum as a literal: use formats.h"
