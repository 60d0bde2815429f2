"""The simulator tier runs one test per seed: `--seed N` replays one run, `--seeds` sets how many
(`--unbounded-seeds` for the unbounded-ledger battles, `--replica-seeds` for walkit.replicate nodes;
the options are declared in tests/conftest.py)."""

from __future__ import annotations


def pytest_generate_tests(metafunc) -> None:
    for name, option in (("seed", "--seeds"), ("unbounded_seed", "--unbounded-seeds"),
                         ("replica_seed", "--replica-seeds")):
        if name in metafunc.fixturenames:
            one = metafunc.config.getoption("--seed")
            seeds = [one] if one is not None else range(metafunc.config.getoption(option))
            metafunc.parametrize(name, seeds)
