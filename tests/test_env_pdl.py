"""The QWEN_FP4_PDL switch on the Python side (the C++ launcher's rule; tests/test_gpu_pdl.py checks that the
launcher follows it): "0" off, "1" on, anything else the default (env.PDL_DEFAULT, off); shown by info."""

from __future__ import annotations

import pytest

from qwen_resnorm_fp4 import env, info


@pytest.mark.parametrize("value, expected", [(None, None), ("1", True), ("0", False), ("", None), ("true", None),
                                             ("00", None)])
def test_pdl_rule(value, expected, monkeypatch):
    if value is None:
        monkeypatch.delenv(env.PDL_VAR, raising=False)
    else:
        monkeypatch.setenv(env.PDL_VAR, value)
    assert env.PDL_DEFAULT is False
    assert env.pdl_enabled() is (env.PDL_DEFAULT if expected is None else expected)


def test_pdl_read_at_every_call(monkeypatch):
    monkeypatch.setenv(env.PDL_VAR, "0")
    assert env.pdl_enabled() is False
    monkeypatch.setenv(env.PDL_VAR, "1")
    assert env.pdl_enabled() is True


def test_info_reports_pdl_and_the_switch(monkeypatch):
    monkeypatch.setenv(env.PDL_VAR, "0")
    doc = info.collect_info()
    assert doc["pdl"] is False
    assert doc["switches"].get(env.PDL_VAR) == "0"
    monkeypatch.delenv(env.PDL_VAR)
    assert info.collect_info()["pdl"] is env.PDL_DEFAULT
    monkeypatch.setenv(env.PDL_VAR, "1")
    assert info.collect_info()["pdl"] is True
