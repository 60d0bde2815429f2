"""The network tier's seeds: `--nemesis-seeds N` runs seeds 1..N of each nemesis test, `--nemesis-seed S`
replays seed S alone, `--nemesis-seconds` sets how long each run's faults last."""

from __future__ import annotations

import pytest

from walkit.testing.network import network_available


def pytest_generate_tests(metafunc) -> None:
    if "nemesis_seed" in metafunc.fixturenames:
        only = metafunc.config.getoption("nemesis_seed")
        seeds = [only] if only is not None else list(range(1, metafunc.config.getoption("nemesis_seeds") + 1))
        metafunc.parametrize("nemesis_seed", seeds, ids=[f"seed{s}" for s in seeds])


@pytest.fixture
def nemesis_seconds(request) -> float:
    return request.config.getoption("nemesis_seconds")


@pytest.fixture(autouse=True)
def _machine_can_run_networks():
    """The machine must be able to run these tests: a missing tool or privilege fails them, never skips."""
    reason = network_available()
    if reason is not None:
        pytest.fail(f"{reason}: run scripts/test.sh as root", pytrace=False)
