"""Clocks: how an engine step gets its start, its duration and its model's share.

MeasuredClock  the step's wall time (CUDA synchronised): what this machine really took.
SimulatedClock a cost model's prediction of the step on some other device (sim/costmodel.py);
               bit-for-bit reproducible, so lessons can print it and nbval can check it.
WallClock      real time since the engine started, idle time included: a server's clock,
               whose requests arrive when their clients send them.

The first two skip idle time: when nothing can run, the clock jumps to the next arrival
instead of sleeping, so an offline workload does not make the learner wait. Step
durations are never skipped.

A step's time is the engine's own work — scheduling, the model, sampling, updating
the requests — as a client would feel it; the model's share is timed apart, so the
rest (the engine's overhead) can be seen. Recording the step on the timeline happens
after the clock stops.
"""
from __future__ import annotations

import time
from typing import Callable

import torch


class Clock:
    """Times what runs on a device (CUDA synchronised, so the GPU's work is counted)."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.cuda = str(device).startswith("cuda")

    def _sync(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def timed(self, execute: Callable, plan) -> tuple[object, float]:
        """`execute(plan)`'s result and the seconds it took."""
        t = self._sync()
        out = execute(plan)
        return out, self._sync() - t


class MeasuredClock(Clock):
    kind = "measured"

    def __init__(self, device: str | torch.device = "cpu"):
        super().__init__(device)
        self.now = 0.0
        self._t0 = 0.0

    def start_step(self) -> float:
        """Start timing a step; returns its start time on the engine's clock."""
        self._t0 = self._sync()
        return self.now

    def end_step(self) -> float:
        """Stop timing; returns the step's end time."""
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

    def start_step(self) -> float:
        return self.now

    def timed(self, execute: Callable, plan) -> tuple[object, float]:
        """`execute(plan)`'s result, and the seconds the cost model says the step takes."""
        self._dt = float(self.step_time(plan))
        return execute(plan), self._dt

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

    def end_step(self) -> float:
        return self._sync() - self.origin

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now))
