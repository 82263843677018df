"""The one rule set (qwen_resnorm_fp4.validation): its limits equal the C++ ones in csrc/op_limits.h, each
broken rule carries both a decline reason and the exception type the wrappers raise, and the wrappers, the
raw CPU ops and the fused path apply the same rules (same outcome for the same broken argument)."""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import validation as v
from qwen_resnorm_fp4.validation import DeclineReason as R
from helpers.paths import REPO_ROOT

CSRC = REPO_ROOT / "csrc"
LIMITS_H = CSRC / "op_limits.h"

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift,
           ast.FloorDiv: operator.floordiv}


def _int_expression(text: str) -> int:
    """The value of a C++ integer constant expression made of literals, int64_t(...), + - * << and
    parentheses (anything else raises ValueError)."""
    tree = ast.parse(re.sub(r"\bint64_t\s*\(", "(", text).replace("/", "//"), mode="eval")

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"not an integer constant expression: {text!r}")

    return ev(tree)


def cxx_limits(text: str) -> dict:
    """name -> value of every `constexpr int64_t kName = <expression>;` line."""
    found = re.findall(r"^\s*constexpr\s+int64_t\s+(k\w+)\s*=\s*([^;]+);", text, re.M)
    return {name: _int_expression(expr) for name, expr in found}


def test_int_expression_parser():
    assert _int_expression("(int64_t(1) << 31) - 128") == (1 << 31) - 128
    assert _int_expression("16384") == 16384 and _int_expression("4 * 16") == 64
    for bad in ("std::abort()", "x + 1", "1.5", "__import__('os')"):
        with pytest.raises((ValueError, SyntaxError)):
            _int_expression(bad)


@pytest.mark.skipif(not CSRC.is_dir(), reason="csrc/ not present (tests run against an installed wheel)")
def test_python_limits_equal_csrc_limits_h():
    limits = cxx_limits(LIMITS_H.read_text())
    assert limits.get("kMaxCols") == v.MAX_COLS
    assert limits.get("kColsMultiple") == v.COLS_MULTIPLE
    assert limits.get("kRowColsMultiple") == v.ROW_COLS_MULTIPLE
    assert limits.get("kMaxRows") == v.MAX_ROWS
    assert limits.get("kMaxDequantizeCols") == v.MAX_DEQUANTIZE_COLS


@pytest.mark.skipif(not CSRC.is_dir(), reason="csrc/ not present (tests run against an installed wheel)")
def test_host_code_writes_no_limit_of_its_own():
    """The host checks (op_checks.h) and wrappers (ops.cpp, ops_fp8.cpp) take every limit they share with
    validation.py from op_limits.h: no literal of those values."""
    for name in ("op_checks.h", "ops.cpp", "ops_fp8.cpp"):
        text = (CSRC / name).read_text()
        for literal in ("16384", "1 << 27", "<< 27", "% 64", "<< 31"):
            assert literal not in text, (name, literal)


def test_width_rule():
    assert [c for c in range(0, 200) if v.is_supported_width(c)] == [64, 128, 192]
    assert v.is_supported_width(v.MAX_COLS) and not v.is_supported_width(v.MAX_COLS + v.COLS_MULTIPLE)
    assert "at most 16384" in v.width_problem("x", 16448).message()
    assert "positive multiple of 64" in v.width_problem("x", 96).message()
    assert [c for c in range(0, 70) if v.is_supported_row_width(c)] == [16, 32, 48, 64]
    assert "positive multiple of 16" in v.width_problem("x", 40, v.ROW_COLS_MULTIPLE).message()
    assert v.width_problem("x", 3072) is None


def test_row_limit():
    """More than MAX_ROWS rows breaks a rule of its own (checked on a meta tensor: no memory)."""
    x = torch.empty(v.MAX_ROWS + 1, 64, dtype=torch.bfloat16, device="meta")
    g = torch.empty(64, dtype=torch.bfloat16, device="meta")
    p = v.resnorm_problem(x, x, None, g, g, g, 1e-6)
    assert p is not None and p.reason is R.UNSUPPORTED_SHAPE and p.error is ValueError
    assert "too many rows" in p.message()
    assert v.resnorm_problem(x[:v.MAX_ROWS], x[:v.MAX_ROWS], None, g, g, g, 1e-6) is None
    y_problem = v.quantize_problem(x, torch.ones(1, device="meta"))
    assert y_problem is not None and "y has too many rows" in y_problem.message()
    with pytest.raises(ValueError, match="x has too many rows"):
        q.resnorm(x, x, None, g, g, g)


def _args(**over):
    d = 128
    base = dict(residual=torch.zeros(2, 4, d, dtype=torch.bfloat16), x=torch.zeros(2, 4, d, dtype=torch.bfloat16),
                bias=None, gate=torch.zeros(2, d), scale=torch.zeros(2, d), shift=torch.zeros(2, d), eps=1e-6,
                weight=None, norm_bias=None, modulate_index=None)
    base.update(over)
    return base


# (mutation, decline reason, exception type): each broken rule carries both. The raw CPU op applies the same
# rules, except where the dispatcher decides first: a non-tensor or a bool for a typed argument (its own
# error), a meta tensor (the meta implementation); those are marked SCHEMA.
SCHEMA = "schema"
RULES = [
    (dict(x=torch.zeros(2, 4, 128, dtype=torch.float16)), R.UNSUPPORTED_DTYPE, TypeError),
    (dict(x=[1.0]), R.UNSUPPORTED_DTYPE, TypeError, SCHEMA),
    (dict(residual=torch.zeros(2, 4, 128, device="meta", dtype=torch.bfloat16)), R.DEVICE_MISMATCH, ValueError,
     SCHEMA),
    (dict(residual=torch.zeros(2, 3, 128, dtype=torch.bfloat16)), R.UNSUPPORTED_SHAPE, ValueError),
    (dict(x=torch.zeros(2, 4, 40, dtype=torch.bfloat16), residual=torch.zeros(2, 4, 40, dtype=torch.bfloat16)),
     R.UNSUPPORTED_WIDTH, ValueError),
    (dict(bias=torch.zeros(64)), R.UNSUPPORTED_SHAPE, ValueError),
    (dict(weight=torch.zeros(64)), R.UNSUPPORTED_NORM, ValueError),
    (dict(norm_bias=torch.zeros(128, dtype=torch.float16)), R.UNSUPPORTED_DTYPE, TypeError),
    (dict(gate=None), R.UNSUPPORTED_MODULATION, TypeError),
    (dict(scale=torch.zeros(128)), R.UNSUPPORTED_MODULATION, ValueError),
    (dict(gate=torch.zeros(3, 128), scale=torch.zeros(3, 128), shift=torch.zeros(3, 128)), R.UNSUPPORTED_MODULATION,
     ValueError),
    (dict(modulate_index=torch.zeros(2, 4)), R.UNSUPPORTED_DTYPE, TypeError),
    (dict(modulate_index=torch.zeros(2, 4, dtype=torch.int32)), R.UNSUPPORTED_MODULATION, ValueError),
    (dict(eps=float("nan")), R.UNSUPPORTED_NORM, ValueError),
    (dict(eps=True), R.UNSUPPORTED_NORM, TypeError, SCHEMA),
]


@pytest.mark.parametrize("mutation,reason,error,raw", [(*r, "") if len(r) == 3 else r for r in RULES])
def test_each_broken_rule_has_a_reason_and_an_error(mutation, reason, error, raw):
    """The rule's Problem: its reason and exception type; the wrapper raises exactly that error, and so does
    the raw CPU op where the dispatcher does not decide first."""
    p = v.resnorm_problem(**_args(**mutation))
    assert p is not None and p.reason is reason and p.error is error
    message = p.message()
    assert message and "{" not in message
    with pytest.raises(error) as wrapper_error:
        q.resnorm(**_args(**mutation))
    assert str(wrapper_error.value) == message
    if raw == SCHEMA:
        return
    with pytest.raises(error) as raw_error:
        a = _args(**mutation)
        torch.ops.qwen_fp4.resnorm(a["residual"], a["x"], a["bias"], a["gate"], a["scale"], a["shift"], a["eps"],
                                   a["weight"], a["norm_bias"], a["modulate_index"])
    assert str(raw_error.value) == message


def test_good_arguments_break_no_rule():
    assert v.resnorm_problem(**_args()) is None
    assert v.resnorm_quant_problem(**dict(_args(), global_scale=torch.ones(1))) is None
    assert v.quantize_problem(torch.zeros(3, 64, dtype=torch.bfloat16), torch.ones(1)) is None


def test_global_scale_rules():
    dev = torch.device("cpu")
    assert v.global_scale_problem(torch.ones(1), dev) is None
    assert v.global_scale_problem(torch.ones(1, dtype=torch.float64), dev).error is TypeError
    assert v.global_scale_problem(torch.ones(2), dev).error is ValueError
    p = v.global_scale_problem(torch.ones(1, device="meta"), dev, name="fc1.input_global_scale")
    assert p.reason is R.DEVICE_MISMATCH and p.message().startswith("fc1.input_global_scale is on meta")


def test_require():
    v.require(None)
    with pytest.raises(ValueError, match="^eps must be finite"):
        v.require(v.eps_problem(-1.0))


def test_ops_module_does_not_import_the_wrappers():
    """ops.py (the op schemas and CPU implementations) takes its rules from validation.py, not api.py."""
    import qwen_resnorm_fp4.ops as ops

    text = Path(ops.__file__).read_text()
    assert "from .api" not in text and "import api" not in text


@pytest.mark.parametrize("wrapper", ["resnorm_quant", "resnorm"])
def test_a_cpu_call_applies_the_rules_once(monkeypatch, wrapper):
    """On CPU tensors the wrapper leaves the rules to the op's CPU implementation: one application per call
    (the wrapper and the op's implementation read the same table entry), and a traced call's fake applies
    them too."""
    import qwen_resnorm_fp4.ops as ops

    entry = ops.OPS[wrapper]
    real, calls = entry.rules, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(entry, "rules", counted)
    a = _args()
    args = [a["residual"], a["x"], a["bias"], a["gate"], a["scale"], a["shift"]]
    if wrapper == "resnorm_quant":
        args.append(torch.ones(1))
    getattr(q, wrapper)(*args)
    assert calls == [1]
    with pytest.raises(TypeError, match="^x must be bfloat16"):
        getattr(q, wrapper)(args[0], args[1].half(), *args[2:])
    assert calls == [1, 1]
    scalars = [1e-6, True] if wrapper == "resnorm_quant" else [1e-6]  # eps (and fast_math)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args]
        fake[1] = fake[1].half()
        with pytest.raises(TypeError, match="^x must be bfloat16"):
            getattr(torch.ops.qwen_fp4, wrapper)(*fake, *scalars)
