"""The test suite's pytest hooks and its one fixture; what they apply lives in the helpers package
(tests/helpers/: helpers.session, helpers.tiers). Test modules import nothing from here: their helpers are
``from helpers.<module> import ...`` (pyproject.toml's ``pythonpath = ["tests"]``).

Fixtures and markers
- ``seed``: a fresh random seed per test (``QWEN_FP4_TEST_SEED=N`` fixes it); torch is seeded with it, and a
  failing test's report has a "seed" section with the command that reruns it with that seed.
- ``@pytest.mark.gpu`` (``pytestmark = pytest.mark.gpu`` for a whole file): the test needs a CUDA GPU and the
  compiled kernels; it is skipped where there is no GPU (or with QWEN_FP4_TEST_CPU_ONLY=1). A session on a GPU
  machine that cannot load the compiled kernels is refused (see the session guard at the end).
- ``@pytest.mark.blackwell``: skipped unless the GPU is a Blackwell (capability 10.x-12.x);
  ``@pytest.mark.blackwell_emulation``: skipped unless the emulation build (QWEN_FP4_EMULATE_BLACKWELL=1) is
  loaded. Both also take ``gpu``'s rule.
- ``exhaustive``: a case of an exhaustive sweep, deselected unless the run asks for the sweep (``--exhaustive``,
  ``QWEN_FP4_TEST_EXHAUSTIVE=1``, or a ``-m`` expression that names ``exhaustive``); ``helpers.tiers.sweep``
  puts it on the parametrizations outside the representative subset. docs/testing.md lists what is behind it.
- ``QWEN_FP4_TEST_PROGRESS=path``: each test's seconds, outcome and failure report appended to ``path`` as it
  finishes (helpers.progress), for a run that a time limit may stop before pytest's summary.
"""

from __future__ import annotations

import pytest
import torch

from helpers import progress, tiers
from helpers.session import SEED_VAR, cache_child_bytecode, draw_seed, marker_skip_reasons, what_runs

# ----------------------------------------------------------------------------------------------------
# Tiers: the default run (a representative case of every behaviour) and the exhaustive sweep
# ----------------------------------------------------------------------------------------------------


def pytest_addoption(parser) -> None:
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="also run the exhaustive sweeps (tests marked 'exhaustive'; by default only the "
                          f"representative cases run). The same as {tiers.EXHAUSTIVE_VAR}=1.")


def pytest_configure(config) -> None:
    tiers.configure(config)
    cache_child_bytecode()


# ----------------------------------------------------------------------------------------------------
# The seed fixture
# ----------------------------------------------------------------------------------------------------

_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture
def seed(request) -> int:
    """A fresh random seed for this test, or ``QWEN_FP4_TEST_SEED``; torch's generators are seeded with it.
    Recorded as the test's "seed" property (junit XML) and shown in the report of a failure."""
    value = draw_seed()
    request.node.stash[_SEED_KEY] = value
    request.node.user_properties.append(("seed", value))
    torch.manual_seed(value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    value = item.stash.get(_SEED_KEY, None)
    if value is not None and report.failed:
        report.sections.append(("seed", f"seed={value}: rerun with {SEED_VAR}={value} python -m pytest "
                                        f"'{item.nodeid}'"))
    return report


def pytest_runtest_logreport(report) -> None:
    progress.record(report)  # QWEN_FP4_TEST_PROGRESS=path: each test's time and outcome as it finishes


# ----------------------------------------------------------------------------------------------------
# The gpu, blackwell and blackwell_emulation markers
# ----------------------------------------------------------------------------------------------------


def pytest_collection_modifyitems(config, items) -> None:
    tiers.select_tier(config, items)
    reasons = None
    for item in items:
        marked = [m for m in ("gpu", "blackwell", "blackwell_emulation") if item.get_closest_marker(m)]
        if not marked:
            continue
        reasons = reasons if reasons is not None else marker_skip_reasons()
        reason = next((reasons[m] for m in marked if reasons[m] is not None), None)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


# ----------------------------------------------------------------------------------------------------
# Session guard: on a GPU machine the compiled kernels must be what is tested
# ----------------------------------------------------------------------------------------------------


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(tiers.tier_line(terminalreporter.config))
    terminalreporter.write_line(what_runs()[0])


def pytest_sessionstart(session) -> None:
    refusal = what_runs()[1]
    if refusal is not None:
        pytest.exit(f"qwen-resnorm-fp4 tests: {refusal}", returncode=3)
