"""Options for the simulator tier: `pytest tests/sim --seed N` replays one run; --seeds sets how many."""

from __future__ import annotations


def pytest_addoption(parser) -> None:
    parser.addoption("--seed", type=int, default=None, help="run the simulation of this one seed")
    parser.addoption("--seeds", type=int, default=2000, help="number of random seeds to simulate (default 2000)")


def pytest_generate_tests(metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        one = metafunc.config.getoption("--seed")
        seeds = [one] if one is not None else range(metafunc.config.getoption("--seeds"))
        metafunc.parametrize("seed", seeds)
