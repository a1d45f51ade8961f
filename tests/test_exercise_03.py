"""Exercise 3's check rejects known-wrong policies and accepts right ones written differently."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # `labs` is a folder of the repository
from labs import checks  # noqa: E402
from minilm.core.policies import Policy  # noqa: E402


class Base(Policy):
    name = "test-policy"

    def __init__(self, watermark: int = 0):
        self.watermark = watermark


def decodes(s) -> None:
    for req in s.unscheduled_running():
        s.schedule_running(req, 1)


def keeps_reserve(s, req, n, watermark) -> bool:
    return s.num_free_blocks - s.blocks_needed(req, n) >= watermark


def fill(s, watermark) -> None:
    while (
        s.waiting
        and s.can_admit(s.waiting[0], s.waiting[0].num_remaining)
        and keeps_reserve(s, s.waiting[0], s.waiting[0].num_remaining, watermark)
    ):
        s.admit(s.waiting[0], s.waiting[0].num_remaining)


# ---- right: the solution, and the same rule written differently ---------------------------
class Solution(Base):
    def schedule(self, s) -> None:
        decodes(s)
        fill(s, self.watermark)


class SnapshotOfTheQueue(Base):
    """Walks a copy of the queue and stops at the first prompt that does not fit; stops the
    decodes when one preempts itself (then every newer one was preempted already)."""

    def schedule(self, s) -> None:
        for req in s.unscheduled_running():
            if not s.schedule_running(req, req.num_remaining):
                break
        for req in list(s.waiting):
            need = s.blocks_needed(req, req.num_remaining)
            if not s.can_admit(req, req.num_remaining) or need + self.watermark > s.num_free_blocks:
                break
            s.admit(req, req.num_remaining)


class ChecksAllButPreemption(Base):
    """Checks seats, budget and KV itself instead of calling can_admit, so it would admit in a
    step that had to preempt, which the scheduler forbids (vLLM's rule against thrashing).
    With whole prompts that never happens: a preempted request goes to the head of the queue,
    and preemption stops as soon as the blocks fit, so fewer blocks are free than the victim
    needs to come back. The check's tight-KV runs preempt, and it accepts this policy."""

    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if (
                s.num_running >= s.config.max_num_seqs
                or n > s.budget
                or s.blocks_needed(req, n) + self.watermark > s.num_free_blocks
            ):
                break
            s.admit(req, n)


RIGHT = [Solution, SnapshotOfTheQueue, ChecksAllButPreemption]


# ---- wrong: batching mistakes ----------------------------------------------------------------
class SkipsDecodes(Base):  # wrong: running requests never get their next token
    def schedule(self, s) -> None:
        fill(s, self.watermark)


class NeverAdmits(Base):  # wrong: the queue is never served
    def schedule(self, s) -> None:
        decodes(s)


class PastMaxNumSeqs(Base):  # wrong: checks the budget and the KV blocks itself, not the free seats
    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            if req.num_remaining > s.budget or not keeps_reserve(
                s, req, req.num_remaining, self.watermark
            ):
                break
            s.admit(req, req.num_remaining)


class IgnoresBudget(Base):  # wrong: checks the seats and the KV blocks, not the token budget
    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            if s.num_running >= s.config.max_num_seqs or not keeps_reserve(
                s, req, req.num_remaining, self.watermark
            ):
                break
            s.admit(req, req.num_remaining)


class FillsBeforeDecodes(
    Base
):  # wrong: admits first with the whole budget, leaving the decodes short
    def schedule(self, s) -> None:
        fill(s, self.watermark)
        decodes(s)


class PromptsListedFirst(Base):
    """Wrong: admits before the decodes, keeping room in the budget for them, but counts the free
    blocks before the decodes take theirs: under a tight KV cache it admits a prompt whose blocks
    a decode needed (at any watermark). The old check's compared runs never ran short of blocks."""

    def schedule(self, s) -> None:
        num_decodes = sum(1 for _ in s.unscheduled_running())
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if (
                n + num_decodes > s.budget
                or not s.can_admit(req, n)
                or not keeps_reserve(s, req, n, self.watermark)
            ):
                break
            s.admit(req, n)
        decodes(s)


class ChunksPrompts(
    Base
):  # wrong: chunked prefill, a prompt that does not fit gets a chunk of what is left
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


class OneAdmissionPerStep(Base):  # wrong: at most one prompt a step
    def schedule(self, s) -> None:
        decodes(s)
        if (
            s.waiting
            and s.can_admit(s.waiting[0], s.waiting[0].num_remaining)
            and keeps_reserve(s, s.waiting[0], s.waiting[0].num_remaining, self.watermark)
        ):
            s.admit(s.waiting[0], s.waiting[0].num_remaining)


class SkipsAheadInTheQueue(Base):  # wrong: admits any waiting request that fits, not only the head
    def schedule(self, s) -> None:
        decodes(s)
        for req in list(s.waiting):
            if s.can_admit(req, req.num_remaining):
                s.admit(req, req.num_remaining)


class DecodesNewestFirst(Base):
    """Wrong: schedules the running requests newest first. Without preemption that is the same
    work; when blocks run out, schedule_running preempts the newest one not yet scheduled, so
    the order decides who is preempted. (The old check compared steps only on a run that never
    preempted, and passed this policy.)"""

    def schedule(self, s) -> None:
        for req in reversed(list(s.unscheduled_running())):
            if req.status.value == "running":
                s.schedule_running(req, 1)
        fill(s, self.watermark)


class AdmitsWhileIterating(Base):
    """Wrong: loops over s.waiting while admit() takes its head: Python stops it with
    "deque mutated during iteration" (a RuntimeError of the policy's own, not a refusal)."""

    def schedule(self, s) -> None:
        decodes(s)
        for req in s.waiting:
            if not s.can_admit(req, req.num_remaining):
                break
            s.admit(req, req.num_remaining)


# ---- wrong: the watermark ----------------------------------------------------------------------
class IgnoresWatermark(Base):  # wrong: the engine's continuous policy, whatever the watermark
    def schedule(self, s) -> None:
        decodes(s)
        fill(s, 0)


class StrictWatermark(
    Base
):  # wrong: demands more than `watermark` free blocks (>), not at least (>=)
    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if (
                not s.can_admit(req, n)
                or s.num_free_blocks - s.blocks_needed(req, n) <= self.watermark
            ):
                break
            s.admit(req, n)


class WatermarkBeforeThePrompt(
    Base
):  # wrong: compares the free blocks before the prompt takes its own
    def schedule(self, s) -> None:
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if not s.can_admit(req, n) or s.num_free_blocks < self.watermark:
                break
            s.admit(req, n)


class WatermarkAtStepStart(
    Base
):  # wrong: counts the free blocks once, before the decodes took theirs
    def schedule(self, s) -> None:
        free = s.num_free_blocks
        decodes(s)
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if not s.can_admit(req, n) or free - s.blocks_needed(req, n) < self.watermark:
                break
            free -= s.blocks_needed(req, n)
            s.admit(req, n)


class WatermarkOnDecodesToo(
    Base
):  # wrong: also refuses a running request its token below the watermark
    def schedule(self, s) -> None:
        for req in s.unscheduled_running():
            if s.num_free_blocks >= self.watermark or req.num_computed_tokens % s._kv.block_size:
                s.schedule_running(req, 1)
        fill(s, self.watermark)


WRONG = [
    SkipsDecodes,
    NeverAdmits,
    PastMaxNumSeqs,
    IgnoresBudget,
    FillsBeforeDecodes,
    PromptsListedFirst,
    ChunksPrompts,
    OneAdmissionPerStep,
    SkipsAheadInTheQueue,
    DecodesNewestFirst,
    AdmitsWhileIterating,
    IgnoresWatermark,
    StrictWatermark,
    WatermarkBeforeThePrompt,
    WatermarkAtStepStart,
    WatermarkOnDecodesToo,
]


@pytest.mark.parametrize("policy", WRONG, ids=lambda p: p.__name__)
def test_check_rejects_a_wrong_policy(policy):
    with pytest.raises(AssertionError):
        checks.check_policy(policy)


@pytest.mark.parametrize("policy", RIGHT, ids=lambda p: p.__name__)
def test_check_accepts_a_right_policy(policy, capsys):
    checks.check_policy(policy)
    assert "passed:" in capsys.readouterr().out


def test_a_python_error_is_not_called_a_refusal():
    with pytest.raises(
        AssertionError, match="your policy's code raised RuntimeError: deque mutated"
    ) as e:
        checks.check_policy(AdmitsWhileIterating)
    assert "refused" not in str(e.value) and "while s.waiting" in str(e.value)


def test_a_refusal_is_called_one():
    with pytest.raises(AssertionError, match="the scheduler refused your policy"):
        checks.check_policy(SkipsAheadInTheQueue)


@pytest.mark.parametrize(
    "policy, words",
    [
        (DecodesNewestFirst, "decides who goes"),
        (WatermarkBeforeThePrompt, "fewer than the watermark"),
    ],
)
def test_the_message_names_the_cause(policy, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_policy(policy)


# ---- part 2: the smallest watermark that avoids preemption ----------------------------------
def preemptions(tl) -> int:
    return sum(step.num_preempted for step in tl.steps)


def scan(run, num_blocks):  # right: the solution's scan, counting preemptions from the steps
    for watermark in range(num_blocks + 1):
        try:
            if preemptions(run(watermark)) == 0:
                return watermark
        except RuntimeError:
            return None
    return None


def scan_requests(run, num_blocks):  # right: no request was ever preempted; a while loop
    watermark = 0
    while watermark <= num_blocks:
        try:
            tl = run(watermark)
        except RuntimeError:
            break
        if not any(r.preemptions for r in tl.requests):
            return watermark
        watermark += 1
    return None


def bisection(run, num_blocks):  # wrong: assumes fewer preemptions with every block of reserve
    lo, hi = 0, num_blocks
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            safe = preemptions(run(mid)) == 0
        except RuntimeError:
            safe = True  # nothing runs, nothing is preempted
        lo, hi = (lo, mid) if safe else (mid + 1, hi)
    return lo


def after_the_last_preemption(run, num_blocks):  # wrong: one past the largest that preempts
    last = -1
    for watermark in range(num_blocks + 1):
        try:
            if preemptions(run(watermark)):
                last = watermark
        except RuntimeError:
            break
    return last + 1


def starts_at_one(run, num_blocks):  # wrong: a watermark of 0 is not tried
    for watermark in range(1, num_blocks + 1):
        try:
            if preemptions(run(watermark)) == 0:
                return watermark
        except RuntimeError:
            return None
    return None


def last_step_only(run, num_blocks):  # wrong: reads the preemptions of the last step alone
    for watermark in range(num_blocks + 1):
        try:
            if run(watermark).steps[-1].num_preempted == 0:
                return watermark
        except RuntimeError:
            return None
    return None


def never_catches(run, num_blocks):  # wrong: runs past the last usable watermark and crashes
    found = [w for w in range(num_blocks + 1) if preemptions(run(w)) == 0]
    return found[0] if found else None


@pytest.mark.parametrize("answer", [scan, scan_requests], ids=lambda f: f.__name__)
def test_safe_watermark_accepts_a_right_search(answer, capsys):
    checks.check_safe_watermark(Solution, answer)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "answer, words",
    [
        (bisection, "a smaller watermark does too"),
        (after_the_last_preemption, "a smaller watermark does too"),
        (starts_at_one, "a smaller watermark does too"),
        (last_step_only, "preempts"),
        (never_catches, "raised RuntimeError"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_safe_watermark_rejects_a_wrong_search(answer, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_safe_watermark(Solution, answer)


def test_safe_watermark_runs_the_learners_policy():
    """The search measures the learner's policy: a policy that ignores the watermark preempts at
    every watermark, so even a right search finds another answer than the reference's."""
    with pytest.raises(AssertionError):
        checks.check_safe_watermark(IgnoresWatermark, scan)


# ---- part 3: a reserve that follows the running requests ------------------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def steps_left(req) -> int:  # the steps it still runs, this one included
    return req.params.max_tokens - len(req.output_ids)


class Reserve(Policy):
    """Part 1's loops; `fits(s, requests, free)` is the admission test: `requests` the running
    ones and the head of the queue, `free` the blocks left once the head has its own."""

    name = "test-reserve"

    def schedule(self, s) -> None:
        running = [r for r in s.unscheduled_running() if s.schedule_running(r, 1)]
        while s.waiting:
            req = s.waiting[0]
            n = req.num_remaining
            if not s.can_admit(req, n) or not self.fits(
                s, running + [req], s.num_free_blocks - s.blocks_needed(req, n)
            ):
                break
            s.admit(req, n)
            running.append(req)

    def fits(self, s, requests, free) -> bool:
        raise NotImplementedError


def grows_by(requests, k: int, bs: int, blocks=cdiv, alive=lambda k, r: k < steps_left(r)) -> int:
    """Blocks the requests hold k steps from now, less what they hold once this step has run."""
    return sum(
        (blocks(r.num_tokens + k, bs) if alive(k, r) else 0) - blocks(r.num_tokens, bs)
        for r in requests
    )


# ---- right ----
class EveryStepAhead(Reserve):  # right: the solution's projection, step by step
    def fits(self, s, requests, free) -> bool:
        bs = s.config.block_size
        return all(
            grows_by(requests, k, bs) <= free for k in range(1, max(map(steps_left, requests)))
        )


class BeforeEachFinish(Reserve):
    """Right, written another way: the blocks all of them hold against the cache's size (only
    they hold any), in the last step of each (between two finishes the need only grows)."""

    def fits(self, s, requests, free) -> bool:
        bs = s.config.block_size
        return all(
            sum(cdiv(r.num_tokens + last, bs) for r in requests if steps_left(r) > last)
            <= s.config.num_blocks
            for last in {steps_left(r) - 1 for r in requests}
        )


RIGHT_RESERVES = [EveryStepAhead, BeforeEachFinish]


# ---- wrong ----
class WholeGrowth(
    Reserve
):  # wrong: keeps free all that every request can still grow, as if none finished first
    def fits(self, s, requests, free) -> bool:
        bs = s.config.block_size
        return (
            sum(
                cdiv(r.num_tokens + steps_left(r) - 1, bs) - cdiv(r.num_tokens, bs)
                for r in requests
            )
            <= free
        )


class OnlyTheNewPrompt(Reserve):  # wrong: the reserve covers the new request's growth alone
    def fits(self, s, requests, free) -> bool:
        bs, r = s.config.block_size, requests[-1]
        return cdiv(r.num_tokens + steps_left(r) - 1, bs) - cdiv(r.num_tokens, bs) <= free


class ABlockEveryBlockSize(Reserve):
    """Wrong, off by one at a block boundary: a request takes a fresh block every block_size
    steps, wherever its last block stands (one that fills its block exactly needs one next step)."""

    def fits(self, s, requests, free) -> bool:
        bs = s.config.block_size
        return all(
            sum(k // bs if k < steps_left(r) else -cdiv(r.num_tokens, bs) for r in requests) <= free
            for k in range(1, max(map(steps_left, requests)))
        )


class FromComputedTokens(Reserve):
    """Wrong, off by one at a block boundary: counts a running request's slots from
    num_computed_tokens, which lags its decode scheduled in this step by one."""

    def fits(self, s, requests, free) -> bool:
        bs, new = s.config.block_size, requests[-1]

        def grown(r, k):
            t = r.num_tokens if r is new else r.num_computed_tokens
            return (cdiv(t + k, bs) if k < steps_left(r) else 0) - cdiv(t, bs)

        return all(
            sum(grown(r, k) for r in requests) <= free
            for k in range(1, max(map(steps_left, requests)))
        )


class FreedAStepEarly(
    Reserve
):  # wrong: a request's blocks come back in the step it samples its last token
    def fits(self, s, requests, free) -> bool:
        bs = s.config.block_size
        alive = lambda k, r: k < steps_left(r) - 1  # noqa: E731
        return all(
            grows_by(requests, k, bs, alive=alive) <= free
            for k in range(1, max(map(steps_left, requests)))
        )


class NextStepOnly(Reserve):  # wrong: covers the blocks the next step needs, not the later ones
    def fits(self, s, requests, free) -> bool:
        return grows_by(requests, 1, s.config.block_size) <= free


class NextBlockSizeSteps(Reserve):
    """Wrong: covers what the requests need in the steps until the next block_size steps have
    passed (at most a block each), not the later ones."""

    def fits(self, s, requests, free) -> bool:
        bs = s.config.block_size

        def grows(k: int) -> int:  # a request that has finished by then counts for nothing
            return sum(
                cdiv(r.num_tokens + k, bs) - cdiv(r.num_tokens, bs)
                for r in requests
                if k < steps_left(r)
            )

        return all(grows(k) <= free for k in range(1, bs))


class ABlockPerRequest(
    Reserve
):  # wrong: a watermark that grows with the batch, a block per request
    def fits(self, s, requests, free) -> bool:
        return free >= len(requests)


class ReserveSkipsDecodes(EveryStepAhead):  # wrong: the reserve, but no decodes
    def schedule(self, s) -> None:
        while s.waiting and s.can_admit(s.waiting[0], s.waiting[0].num_remaining):
            req = s.waiting[0]
            if not self.fits(s, [req], s.num_free_blocks - s.blocks_needed(req, req.num_remaining)):
                break
            s.admit(req, req.num_remaining)


class ShortestFirst(
    EveryStepAhead
):  # wrong: the queue by fewest output tokens, not first come, first served
    def schedule(self, s) -> None:
        if len(s.waiting) > 1:
            s.reorder_waiting(sorted(s.waiting, key=lambda r: r.params.max_tokens))
        super().schedule(s)


class HeadStepsAside(EveryStepAhead):  # wrong: a head that does not fit goes behind the next one
    def schedule(self, s) -> None:
        super().schedule(s)
        if len(s.waiting) > 1:
            head, second, *rest = s.waiting
            s.reorder_waiting([second, head, *rest])
            super().schedule(s)


WRONG_RESERVES = [
    (WholeGrowth, "mean TTFT"),
    (OnlyTheNewPrompt, "preempted"),
    (ABlockEveryBlockSize, "preempted"),
    (FromComputedTokens, "preempted"),
    (FreedAStepEarly, "preempted"),
    (NextStepOnly, "preempted"),
    (NextBlockSizeSteps, "preempted"),
    (ABlockPerRequest, "mean TTFT"),
    (ReserveSkipsDecodes, "refused"),
    (ShortestFirst, "first come, first served"),
    (HeadStepsAside, "first come, first served"),
]


@pytest.mark.parametrize("policy", RIGHT_RESERVES, ids=lambda p: p.__name__)
def test_reserve_accepts_a_right_policy(policy, capsys):
    checks.check_adaptive_reserve(policy)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("policy, words", WRONG_RESERVES, ids=lambda x: getattr(x, "__name__", ""))
def test_reserve_rejects_a_wrong_policy(policy, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_adaptive_reserve(policy)


@pytest.mark.parametrize(
    "watermark, words",
    [
        (0, "preempted"),
        (1, "preempted"),
        (2, "preempted"),
        (5, "mean TTFT"),
        (28, "mean TTFT"),
        (39, "refused"),
    ],
)
def test_reserve_rejects_a_fixed_watermark(watermark, words):
    """0 (the engine's continuous batching), each workload's smallest safe one hard-coded (1,
    2, 3, 5, 28: each preempts on a later workload or is slow on the first), a huge one."""
    with pytest.raises(AssertionError, match=words):
        checks.check_adaptive_reserve(lambda: Solution(watermark))


def test_no_fixed_watermark_passes_every_workload():
    for watermark in range(checks.RESERVE_BLOCKS + 1):
        with pytest.raises(AssertionError):
            checks.check_adaptive_reserve(lambda w=watermark: Solution(w))


def test_reserve_message_names_the_step_and_the_bound():
    with pytest.raises(AssertionError, match=r"preempted 1 time\(s\), first at step \d+") as e:
        checks.check_adaptive_reserve(lambda: Solution(2))
    assert "workload 3 of 5" in str(e.value)
    with pytest.raises(AssertionError, match=r"mean TTFT of [\d.]+ ms .* takes [\d.]+ ms"):
        checks.check_adaptive_reserve(lambda: Solution(8))
