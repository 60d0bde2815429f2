"""The simulator tier runs one test per seed: `--seed N` replays one run, `--seeds` sets how many
(the options are declared in tests/conftest.py)."""

from __future__ import annotations


def pytest_generate_tests(metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        one = metafunc.config.getoption("--seed")
        seeds = [one] if one is not None else range(metafunc.config.getoption("--seeds"))
        metafunc.parametrize("seed", seeds)
