"""Clocks: a step's start, its duration and its model's share (docs/DESIGN.md, "Clocks").

MeasuredClock  the step's wall time (CUDA synchronised): what this machine took.
SimulatedClock a cost model's prediction for another device (sim/costmodel.py), bit-for-bit
               reproducible, so lessons can print it and nbval can check it.
WallClock      real time since the engine started, idle time included: a server's clock.

The first two skip idle time: with nothing to run they jump to the next arrival.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..model.runner import device_time


class Clock:
    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device).type

    def _sync(self) -> float:
        return device_time(self.device)

    def timed(self, execute: Callable, plan) -> tuple[object, float]:
        """`execute(plan)`'s result and the seconds it took."""
        t = self._sync()
        out = execute(plan)
        return out, self._sync() - t


class MeasuredClock(Clock):
    kind = "measured"

    def __init__(self, device: str | torch.device = "cpu"):
        super().__init__(device)
        self.now, self._t0 = 0.0, 0.0

    def start_step(self) -> float:
        self._t0 = self._sync()
        return self.now

    def end_step(self) -> float:
        self.now += self._sync() - self._t0
        return self.now

    def wait_until(self, t: float) -> None:
        self.now = max(self.now, t)


class SimulatedClock(MeasuredClock):
    kind = "simulated"

    def __init__(self, step_time: Callable[[object], float]):
        super().__init__("cpu")
        self.step_time = step_time  # plan -> seconds
        self._dt = 0.0

    def timed(self, execute: Callable, plan) -> tuple[object, float]:
        self._dt = float(self.step_time(plan))
        return execute(plan), self._dt

    def start_step(self) -> float:
        return self.now

    def end_step(self) -> float:
        self.now += self._dt
        return self.now


class WallClock(Clock):
    kind = "wall"

    def __init__(self, device: str | torch.device = "cpu"):
        super().__init__(device)
        self.origin = time.perf_counter()

    @property
    def now(self) -> float:
        return time.perf_counter() - self.origin

    def start_step(self) -> float:
        return self._sync() - self.origin

    end_step = start_step

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now))
