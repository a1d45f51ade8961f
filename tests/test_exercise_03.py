"""Exercise 3's check rejects known-wrong policies and accepts right ones written differently."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `labs` is a folder of the repository
from labs import checks  # noqa: E402
from minilm.core.policies import Policy  # noqa: E402


def decodes(s) -> None:
    for req in s.unscheduled_running():
        s.schedule_running(req, 1)


def fill(s) -> None:
    while s.waiting and s.can_admit(s.waiting[0], s.waiting[0].num_remaining):
        s.admit(s.waiting[0], s.waiting[0].num_remaining)


# ---- right: the solution, and the same rule written differently ---------------------------
class Solution(Policy):
    name = "solution"

    def schedule(self, s) -> None:
        decodes(s)
        fill(s)


class PromptsListedFirst(Policy):
    """Admits before it schedules the decodes, keeping room in the budget for them: the
    same work, in a different order in the step."""

    name = "prompts-first"

    def schedule(self, s) -> None:
        num_decodes = sum(1 for _ in s.unscheduled_running())
        while s.waiting:
            req = s.waiting[0]
            if req.num_remaining + num_decodes > s.budget or not s.can_admit(req, req.num_remaining):
                break
            s.admit(req, req.num_remaining)
        decodes(s)


class SnapshotOfTheQueue(Policy):
    """Walks a copy of the queue and stops at the first prompt that does not fit."""

    name = "snapshot"

    def schedule(self, s) -> None:
        for req in s.unscheduled_running():
            if not s.schedule_running(req, req.num_remaining):
                break  # it was preempted itself: every older request is scheduled already
        for req in list(s.waiting):
            if not s.can_admit(req, req.num_remaining):
                break
            s.admit(req, req.num_remaining)


# ---- wrong ----------------------------------------------------------------------------------
class SkipsDecodes(Policy):
    name = "skips-decodes"

    def schedule(self, s) -> None:
        fill(s)


class NeverAdmits(Policy):
    name = "never-admits"

    def schedule(self, s) -> None:
        decodes(s)


class PastMaxNumSeqs(Policy):
    """Checks the budget and the KV blocks itself, but not the free seats."""

    name = "past-max-num-seqs"

    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            if req.num_remaining > s.budget or s.blocks_needed(req, req.num_remaining) > s.num_free_blocks:
                break
            s.admit(req, req.num_remaining)


class IgnoresBudget(Policy):
    """Checks the seats and the KV blocks, not the token budget."""

    name = "ignores-budget"

    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            if s.num_running >= s.config.max_num_seqs or s.blocks_needed(req, req.num_remaining) > s.num_free_blocks:
                break
            s.admit(req, req.num_remaining)


class ChecksAllButPreemption(Policy):
    """Checks seats, budget and KV itself instead of calling can_admit, so it would admit in a
    step that had to preempt, which the scheduler forbids (vLLM's rule against thrashing).
    With whole prompts that never happens: a preempted request goes to the head of the queue,
    and preemption stops as soon as the blocks fit, so fewer blocks are free than the victim
    needs to come back. The check has no step where this policy differs, and accepts it."""

    name = "checks-all-but-preemption"

    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if s.num_running >= s.config.max_num_seqs or n > s.budget or s.blocks_needed(req, n) > s.num_free_blocks:
                break
            s.admit(req, n)


class FillsBeforeDecodes(Policy):
    """Admits first with the whole budget, leaving the running requests' decodes short."""

    name = "fills-first"

    def schedule(self, s) -> None:
        fill(s)
        decodes(s)


class ChunksPrompts(Policy):
    """Chunked prefill: a prompt that does not fit gets a chunk of what is left."""

    name = "chunks"

    def schedule(self, s) -> None:
        for req in s.unscheduled_running():
            if s.budget:
                s.schedule_running(req, min(req.num_remaining, s.budget))
        while s.waiting and s.budget:
            req = s.waiting[0]
            n = min(req.num_remaining, s.budget)
            if not s.can_admit(req, n):
                break
            s.admit(req, n)


class OneAdmissionPerStep(Policy):
    name = "one-per-step"

    def schedule(self, s) -> None:
        decodes(s)
        if s.waiting and s.can_admit(s.waiting[0], s.waiting[0].num_remaining):
            s.admit(s.waiting[0], s.waiting[0].num_remaining)


class SkipsAheadInTheQueue(Policy):
    """Admits any waiting request that fits, not only the head (admit takes the head only)."""

    name = "skips-ahead"

    def schedule(self, s) -> None:
        decodes(s)
        for req in list(s.waiting):
            if s.can_admit(req, req.num_remaining):
                s.admit(req, req.num_remaining)


WRONG = [SkipsDecodes, NeverAdmits, PastMaxNumSeqs, IgnoresBudget, FillsBeforeDecodes, ChunksPrompts,
         OneAdmissionPerStep, SkipsAheadInTheQueue]
RIGHT = [Solution, PromptsListedFirst, SnapshotOfTheQueue, ChecksAllButPreemption]


@pytest.mark.parametrize("policy", WRONG, ids=lambda p: p.name)
def test_check_rejects_a_wrong_policy(policy):
    with pytest.raises(AssertionError):
        checks.check_policy(policy)


@pytest.mark.parametrize("policy", RIGHT, ids=lambda p: p.name)
def test_check_accepts_a_right_policy(policy, capsys):
    checks.check_policy(policy)
    assert "passed:" in capsys.readouterr().out
