"""The two tiers of the suite: the default run (a representative case of every behaviour) and the exhaustive
sweep (docs/testing.md).

- ``sweep(argnames, values, default)``: ``pytest.mark.parametrize`` in two tiers: ``default`` (a subset of
  ``values``) runs by default, the other values are marked ``exhaustive``.
- ``exhaustive_run()``: whether this session runs the exhaustive sweep (for settings chosen at import).
- ``exhaustive_requested(config)``, ``select_tier(config, items)``, ``tier_line(config)``: what tests/conftest.py's
  hooks do with them (``configure(config)`` records the session's tier, from its ``pytest_configure``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Optional

import pytest

#: Set to "1" to run the exhaustive sweep, as ``--exhaustive`` does.
EXHAUSTIVE_VAR = "QWEN_FP4_TEST_EXHAUSTIVE"
EXHAUSTIVE_MARKER = "exhaustive"  # registered with its help in pyproject.toml's [tool.pytest.ini_options]

_EXHAUSTIVE_RUN: Optional[bool] = None  # set by configure (tests/conftest.py's pytest_configure)
DESELECTED_KEY = pytest.StashKey[int]()


def exhaustive_requested(config) -> bool:
    """--exhaustive, QWEN_FP4_TEST_EXHAUSTIVE=1, or a -m expression naming the marker (which then selects)."""
    if config.getoption("exhaustive", False) or os.environ.get(EXHAUSTIVE_VAR, "").strip() == "1":
        return True
    return bool(re.search(rf"\b{EXHAUSTIVE_MARKER}\b", config.getoption("markexpr", "") or ""))


def configure(config) -> None:
    """Record this session's tier (for :func:`exhaustive_run`)."""
    global _EXHAUSTIVE_RUN
    _EXHAUSTIVE_RUN = exhaustive_requested(config)


def exhaustive_run() -> bool:
    """Whether this session runs the exhaustive sweep (--exhaustive / QWEN_FP4_TEST_EXHAUSTIVE=1 / -m exhaustive);
    for what a test module decides at import (hypothesis' example counts). False outside a pytest session."""
    if _EXHAUSTIVE_RUN is not None:
        return _EXHAUSTIVE_RUN
    return os.environ.get(EXHAUSTIVE_VAR, "").strip() == "1"


def sweep(argnames, values: Iterable, default: Iterable, *, ids=None):
    """``pytest.mark.parametrize(argnames, values, ids=ids)`` in two tiers: the values in ``default``, the
    representative cases, run in every session; the others are marked ``exhaustive`` and run only in the
    exhaustive sweep. ``default`` must be a subset of ``values`` (checked), so the sweep always holds the
    default. With several argnames each value is a tuple of them, as for parametrize."""
    names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
    values, default = list(values), list(default)
    missing = [d for d in default if not any(d is v or d == v for v in values)]
    if missing or not default:
        raise ValueError(f"sweep({argnames!r}): the default {default!r} must be a non-empty subset of the values "
                         f"{values!r} (missing {missing!r})")
    params = []
    for v in values:
        in_default = any(v is d or v == d for d in default)
        args = tuple(v) if len(names) > 1 else (v,)
        params.append(pytest.param(*args, marks=() if in_default else (pytest.mark.exhaustive,)))
    return pytest.mark.parametrize(argnames, params, ids=ids)


def named_node_ids(config) -> set:
    """The node ids named on the command line (path::name[params]), relative to the rootdir like item.nodeid:
    such a test runs whatever its tier (a failure's rerun command names it)."""
    named = set()
    for arg in config.args:
        if "::" not in arg:
            continue
        path, rest = arg.split("::", 1)
        try:
            rel = Path(path).resolve().relative_to(config.rootpath).as_posix()
        except ValueError:
            rel = path
        named.add(f"{rel}::{rest}")
    return named


def select_tier(config, items) -> None:
    """Outside the exhaustive sweep, deselect the tests marked exhaustive (unless named on the command line)."""
    if exhaustive_requested(config):
        return
    named = named_node_ids(config)
    kept, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker(EXHAUSTIVE_MARKER) and item.nodeid not in named else kept).append(item)
    config.stash[DESELECTED_KEY] = len(dropped)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def tier_line(config) -> str:
    """The summary line that names this session's tier and how many cases it left out."""
    if exhaustive_requested(config):
        return "tests: the exhaustive sweep (every case; the default run deselects those marked exhaustive)"
    n = config.stash.get(DESELECTED_KEY, None)  # None: collected elsewhere (pytest-xdist workers)
    left_out = f"{n} cases of the exhaustive sweeps deselected" if n is not None else "the exhaustive sweeps left out"
    return f"tests: the default tier ({left_out}; --exhaustive or {EXHAUSTIVE_VAR}=1 runs them too)"
