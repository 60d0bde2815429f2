"""The simulator tier runs one test per seed: `--seed N` replays one run, `--seeds` sets how many
(`--unbounded-seeds` for the unbounded-ledger battles, `--replica-seeds` for walkit.replicate nodes),
and `--sim-draw` how each seed draws its configuration: `hard` (the default, what CI runs) from the
hostile end of every range, `any` from the whole range. The options are declared in
tests/conftest.py; docs/internals/testing.md#hard-seeds says why CI runs fewer, harder seeds and how
to run the long ones.
"""

from __future__ import annotations

import pytest


def pytest_generate_tests(metafunc) -> None:
    for name, option in (("seed", "--seeds"), ("unbounded_seed", "--unbounded-seeds"),
                         ("replica_seed", "--replica-seeds")):
        if name in metafunc.fixturenames:
            one = metafunc.config.getoption("--seed")
            seeds = [one] if one is not None else range(metafunc.config.getoption(option))
            metafunc.parametrize(name, seeds)


@pytest.fixture(scope="session")
def hard(request) -> bool:
    """hard tells the seeded tests to draw their configurations from the hostile end (--sim-draw)."""
    return request.config.getoption("--sim-draw") == "hard"
