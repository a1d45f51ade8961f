"""Clocks: how an engine step gets its duration.

MeasuredClock  the step's wall time (CUDA synchronised): what this machine really took.
SimulatedClock a cost model's prediction of the step on some other device (costmodel.py);
               bit-for-bit reproducible, so lessons can print it and nbval can check it.

Both skip idle time: when nothing can run, the clock jumps to the next arrival instead
of sleeping, so an online workload does not make the learner wait. Step durations are
never skipped.
"""
from __future__ import annotations

import time
from typing import Callable

import torch


class MeasuredClock:
    kind = "measured"

    def __init__(self, device: str | torch.device = "cpu"):
        self.now = 0.0
        self.cuda = torch.device(device).type == "cuda"
        self._t0 = 0.0

    def start_step(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def end_step(self, plan) -> float:
        """Seconds since `start_step`; the engine adds them to `now`."""
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - self._t0

    def wait_until(self, t: float) -> None:
        self.now = max(self.now, t)


class SimulatedClock(MeasuredClock):
    kind = "simulated"

    def __init__(self, step_time: Callable[[object], float]):
        super().__init__("cpu")
        self.step_time = step_time  # plan -> seconds

    def start_step(self) -> None:
        pass

    def end_step(self, plan) -> float:
        return float(self.step_time(plan))
