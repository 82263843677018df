"""The launch switches on the Python side: QWEN_FP4_PDL's rule ("0" off, "1" on, anything else the default,
env.PDL_DEFAULT, off) and QWEN_FP4_KERNEL_PATH's, both read once when the package loads (a fresh
interpreter here); set_launch_options changes them at run time, refuses bad values, returns the previous
options; info reports the options in force. tests/launch/test_gpu_pdl.py checks that the launcher follows them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import qwen_resnorm_fp4 as q
from helpers.paths import PACKAGE_PARENT, package_env
from helpers.session import HANG_GUARD_S
from qwen_resnorm_fp4 import env, info


@pytest.mark.parametrize("value, expected", [(None, None), ("1", True), ("0", False), ("", None), ("true", None),
                                             ("00", None)])
def test_pdl_rule(value, expected, monkeypatch):
    if value is None:
        monkeypatch.delenv(env.PDL_VAR, raising=False)
    else:
        monkeypatch.setenv(env.PDL_VAR, value)
    assert env.PDL_DEFAULT is False
    assert env.pdl_from_env() is (env.PDL_DEFAULT if expected is None else expected)


def _options_at_import(**variables) -> str:
    """repr(launch_options()) in a fresh interpreter whose environment has ``variables`` (None: unset)."""
    base = {k: v for k, v in os.environ.items() if k not in (env.PDL_VAR, env.KERNEL_PATH_VAR)}
    child_env = package_env(base, **{k: v for k, v in variables.items() if v is not None})
    code = "import qwen_resnorm_fp4 as q; print(tuple(q.launch_options()))"
    out = subprocess.run([sys.executable, "-c", code], env=child_env, cwd=PACKAGE_PARENT, capture_output=True,
                         text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_switches_are_read_when_the_package_loads():
    """Two fresh interpreters: the defaults, then both switches set (each value's rule, in this process:
    test_pdl_rule, and tests/package/test_cli.py's kernel path switch tests)."""
    assert _options_at_import() == repr((env.KERNEL_PATH_DEFAULT, env.PDL_DEFAULT))
    # an invalid path does not stop the import: it is kept, and the quantizing CUDA ops raise
    assert _options_at_import(QWEN_FP4_PDL="1", QWEN_FP4_KERNEL_PATH="hopper") == repr(("hopper", True))


def test_set_launch_options_returns_the_previous_and_refuses_bad_values():
    before = q.launch_options()
    try:
        assert q.set_launch_options(pdl=True) == before
        assert q.launch_options() == (before.kernel_path, True)
        assert q.set_launch_options(kernel_path="portable", pdl=False) == (before.kernel_path, True)
        assert q.launch_options() == q.LaunchOptions("portable", False)
        assert q.set_launch_options() == q.launch_options()  # None keeps both
        for bad, error in (dict(kernel_path="hopper"), ValueError), (dict(kernel_path=1), TypeError), \
                          (dict(pdl=1), TypeError), (dict(pdl="1"), TypeError):
            with pytest.raises(error, match=next(iter(bad))):
                q.set_launch_options(**bad)
        assert q.launch_options() == q.LaunchOptions("portable", False)
    finally:
        q.set_launch_options(*before)


def test_environment_changes_after_load_do_not_switch(monkeypatch):
    before = q.launch_options()
    monkeypatch.setenv(env.PDL_VAR, "0" if before.pdl else "1")
    monkeypatch.setenv(env.KERNEL_PATH_VAR, "hopper")
    assert q.launch_options() == before


def test_info_reports_the_options_in_force(monkeypatch):
    before = q.launch_options()
    try:
        q.set_launch_options(pdl=False)
        monkeypatch.setenv(env.PDL_VAR, "1")
        doc = info.collect_info()
        assert doc["pdl"] is False
        assert doc["switches"].get(env.PDL_VAR) == "1"
        q.set_launch_options(pdl=True)
        assert info.collect_info()["pdl"] is True
    finally:
        q.set_launch_options(*before)
