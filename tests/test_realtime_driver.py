"""The wall-clock driver's wait: sleeps the long part, spins the end, never returns early."""
from __future__ import annotations

import testbed.engine.driver as driver


class FakeClock:
    """A clock that moves by `tick` per reading and by the slept time when sleep is called."""

    def __init__(self, tick: float):
        self.t, self.tick, self.slept = 0.0, tick, []

    def __call__(self) -> float:
        self.t += self.tick
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_a_long_wait_sleeps_until_the_spin_window_then_spins(monkeypatch):
    clock = FakeClock(tick=1e-5)
    monkeypatch.setattr(driver.time, "sleep", clock.sleep)
    driver.wait_until(clock, 0.5)
    assert clock.t >= 0.5
    assert len(clock.slept) == 1 and 0.5 - driver.SPIN_S - 1e-3 < clock.slept[0] <= 0.5 - driver.SPIN_S


def test_a_short_wait_only_spins(monkeypatch):
    clock = FakeClock(tick=1e-5)
    monkeypatch.setattr(driver.time, "sleep", clock.sleep)
    driver.wait_until(clock, driver.SPIN_S / 2)
    assert clock.t >= driver.SPIN_S / 2 and clock.slept == []


def test_a_time_already_past_returns_at_once(monkeypatch):
    clock = FakeClock(tick=1e-5)
    clock.t = 3.0
    monkeypatch.setattr(driver.time, "sleep", clock.sleep)
    driver.wait_until(clock, 1.0)
    assert clock.slept == [] and clock.t < 3.0 + 1e-4
