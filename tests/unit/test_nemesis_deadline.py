"""walkit.testing.nemesis.Deadline: a workload goes on past a nemesis that healed late, within a bound."""

from __future__ import annotations

import pytest

from walkit.testing import nemesis
from walkit.testing.nemesis import Deadline


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(nemesis.time, "monotonic", lambda: now[0])
    return now


def test_without_a_healed_file_the_workload_ends_at_the_planned_time(clock):
    deadline = Deadline(10)
    clock[0] = 109.9
    assert not deadline.passed()
    clock[0] = 110.0
    assert deadline.passed() and deadline.ended_at == 110.0


def test_a_nemesis_that_heals_late_keeps_the_workload_going_until_seconds_after_its_end(clock, tmp_path):
    healed = tmp_path / "healed"
    deadline = Deadline(10, str(healed), after_heal_s=3)
    clock[0] = 125.0                              # planned end long past, the nemesis still running
    assert not deadline.passed()
    healed.touch()
    clock[0] = 126.0
    assert not deadline.passed()                  # the heal is seen now: 3 s more
    clock[0] = 128.9
    assert not deadline.passed()
    clock[0] = 129.0
    assert deadline.passed()
    clock[0] = 130.0
    assert deadline.passed() and deadline.ended_at == 129.0


def test_an_early_heal_does_not_end_the_workload_before_its_planned_time(clock, tmp_path):
    healed = tmp_path / "healed"
    healed.touch()
    deadline = Deadline(10, str(healed), after_heal_s=3)
    clock[0] = 105.0
    assert not deadline.passed()
    clock[0] = 110.0
    assert deadline.passed()


def test_a_file_that_never_comes_ends_the_workload_at_most_most_s_late(clock, tmp_path):
    deadline = Deadline(10, str(tmp_path / "never"), most_s=120)
    clock[0] = 229.9
    assert not deadline.passed()
    clock[0] = 230.0
    assert deadline.passed()
