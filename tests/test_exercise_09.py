"""Exercise 9's check rejects known-wrong stop-string checkers with the reason, and accepts right
ones written another way (and the server's own, whose fixed window it rejects as too cautious)."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from labs import checks  # noqa: E402
from minilm.serve.detokenizer import StopChecker  # noqa: E402


# ---- right answers, written other ways -----------------------------------------------------------
class WithRegex:
    """A regex alternation for the search, a loop over lengths for what to hold."""

    def __init__(self, stops, include=False):
        self.stops, self.include, self.buf = stops, include, ""

    def add(self, text, final):
        self.buf += text
        hits = [
            (m.start(), len(s))
            for s in self.stops
            for m in [re.search(re.escape(s), self.buf)]
            if m
        ]
        if hits:
            start, n = min(hits)
            return self.buf[: start + n if self.include else start], True
        keep = 0
        if not final:
            for n in range(min(len(self.buf), max(map(len, self.stops), default=1) - 1), 0, -1):
                if any(s.startswith(self.buf[-n:]) and len(s) > n for s in self.stops):
                    keep = n
                    break
        out, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
        return out, False


class CharByChar:
    """Feeds the text a character at a time, as if every character were a token."""

    def __init__(self, stops, include=False):
        self.stops, self.include, self.pending, self.done = stops, include, "", False

    def add(self, text, final):
        out = ""
        for ch in text:
            self.pending += ch
            hits = [(self.pending.find(s), len(s)) for s in self.stops if s in self.pending]
            if hits:
                start, n = min(hits)
                return out + self.pending[: start + n if self.include else start], True
            while self.pending and not any(s.startswith(self.pending) for s in self.stops):
                out, self.pending = out + self.pending[0], self.pending[1:]
        if final:
            out, self.pending = out + self.pending, ""
        return out, False


@pytest.mark.parametrize("right", [WithRegex, CharByChar])
def test_right_checkers_pass(right, capsys):
    checks.check_stop_checker(right)
    assert "passed" in capsys.readouterr().out


# ---- wrong answers --------------------------------------------------------------------------------
class Base(checks.StopReference):
    def __init__(self, stops, include=False):
        super().__init__(stops, include)


class HoldsNothing(Base):  # wrong: sends text that may begin a stop string
    def add(self, text, final):
        return super().add(text, True)


class PerTokenOnly(Base):  # wrong: searches each token alone, never the held text with it
    def add(self, text, final):
        self.held = ""
        return super().add(text, final)


class FirstListed(Base):  # wrong: the first stop string of the list, not the first in the text
    def add(self, text, final):
        whole = self.held + text
        for s in self.stops:
            if s in whole:
                i = whole.find(s)
                return whole[: i + len(s) if self.include else i], True
        return super().add(text, final)


class IgnoresInclude(Base):  # wrong: never sends the stop string
    def __init__(self, stops, include=False):
        super().__init__(stops, False)


class AlwaysIncludes(Base):  # wrong: sends the stop string even when not asked
    def __init__(self, stops, include=False):
        super().__init__(stops, True)


class NoFlush(Base):  # wrong: keeps holding on the last token
    def add(self, text, final):
        return super().add(text, False)


class LongestPrefixOnly(
    Base
):  # wrong: holds only when the end is the stop string less its last character
    def add(self, text, final):
        text = self.held + text
        found = sorted((text.find(s), len(s)) for s in self.stops if s in text)
        if found:
            start, n = found[0]
            return text[: start + n if self.include else start], True
        keep = max(
            (len(s) - 1 for s in self.stops if not final and len(s) > 1 and text.endswith(s[:-1])),
            default=0,
        )
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep], False


class LongestStopOnTie(Base):  # wrong: of two stops at the same place, the longer
    def add(self, text, final):
        whole = self.held + text
        found = sorted((whole.find(s), -len(s)) for s in self.stops if s in whole)
        if found:
            start, n = found[0]
            return whole[: start - n if self.include else start], True
        return super().add(text, final)


def fixed_window(stops, include=False):  # the server's own: too cautious for this exercise
    return StopChecker(stops)


WRONG = {
    "holds nothing": (HoldsNothing, "could still be the start of a stop string"),
    "per token only": (PerTokenOnly, "held back from earlier tokens"),
    "first listed": (FirstListed, "starts first"),
    "ignores include": (IgnoresInclude, "the stop string itself is sent too"),
    "always includes": (AlwaysIncludes, "send only the text before the stop string"),
    "no flush": (NoFlush, "nothing is held back"),
    "longest prefix only": (LongestPrefixOnly, "could still be the start of a stop string"),
    "longest on a tie": (LongestStopOnTie, "the shorter on a tie"),
    "fixed window": (fixed_window, "cannot begin any stop string"),
    "returns a string": (
        lambda stops, include=False: type("T", (), {"add": lambda self, t, f: t})(),
        "return (text to send, stopped)",
    ),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_checkers_fail_with_the_reason(name):
    wrong, reason = WRONG[name]
    with pytest.raises(AssertionError) as err:
        checks.check_stop_checker(wrong)
    assert reason in str(err.value)


def test_the_reference_agrees_with_the_server_where_the_server_sends_at_all():
    """The server's fixed window and the exercise's rule end every stream at the same place and send
    the same text in all; they differ only in when."""
    for stops, include, pieces in checks.STOP_CASES:
        if include:
            continue
        totals = []
        for checker in (checks.StopReference(stops), StopChecker(stops)):
            sent = ""
            for i, p in enumerate(pieces):
                text, stopped = checker.add(p, i == len(pieces) - 1)
                sent += text
                if stopped:
                    break
            totals.append((sent, stopped))
        assert totals[0] == totals[1], (stops, pieces)


# ---- 2. char_delays (issue 29.1) --------------------------------------------------------------
def delays_solution(pieces, times, checker):
    arrived = [t for piece, t in zip(pieces, times) for _ in piece]
    delays = []
    for i, (piece, t) in enumerate(zip(pieces, times)):
        text, stopped = checker.add(piece, i == len(pieces) - 1)
        delays += [t - arrived[n] for n in range(len(delays), len(delays) + len(text))]
        if stopped:
            break
    return delays


def delays_by_bisect(
    pieces, times, checker
):  # right: token boundaries, found with bisect; numpy out
    import bisect

    import numpy as np

    ends = list(
        itertools.accumulate(len(p) for p in pieces)
    )  # position just past each token's text
    out, sent = [], 0
    for i, piece in enumerate(pieces):
        text, stopped = checker.add(piece, i == len(pieces) - 1)
        for n in range(sent, sent + len(text)):
            out.append(np.float64(times[i] - times[bisect.bisect_right(ends, n)]))
        sent += len(text)
        if stopped:
            break
    return out


def delays_all_zero(
    pieces, times, checker
):  # wrong: every character charged to the token that sent it
    return [0.0 for d in delays_solution(pieces, times, checker)]


def delays_per_chunk(pieces, times, checker):  # wrong: one delay per chunk sent, not per character
    out = []
    for i, (piece, t) in enumerate(zip(pieces, times)):
        text, stopped = checker.add(piece, i == len(pieces) - 1)
        if text:
            out.append(0.0)
        if stopped:
            break
    return out


def delays_after_stop(pieces, times, checker):  # wrong: goes on after the checker said stopped
    arrived = [t for piece, t in zip(pieces, times) for _ in piece]
    delays = []
    for i, (piece, t) in enumerate(zip(pieces, times)):
        text, _ = checker.add(piece, i == len(pieces) - 1)
        delays += [
            t - arrived[min(n, len(arrived) - 1)]
            for n in range(len(delays), len(delays) + len(text))
        ]
    return delays


def delays_never_final(pieces, times, checker):  # wrong: the last token not marked final
    arrived = [t for piece, t in zip(pieces, times) for _ in piece]
    delays = []
    for piece, t in zip(pieces, times):
        text, stopped = checker.add(piece, False)
        delays += [t - arrived[n] for n in range(len(delays), len(delays) + len(text))]
        if stopped:
            break
    return delays


def delays_token_index(pieces, times, checker):  # wrong: character n taken to come with token n
    delays = []
    for i, (piece, t) in enumerate(zip(pieces, times)):
        text, stopped = checker.add(piece, i == len(pieces) - 1)
        delays += [
            t - times[min(n, len(times) - 1)] for n in range(len(delays), len(delays) + len(text))
        ]
        if stopped:
            break
    return delays


def delays_from_first_token(
    pieces, times, checker
):  # wrong: every delay measured from the stream's start
    delays = []
    for i, (piece, t) in enumerate(zip(pieces, times)):
        text, stopped = checker.add(piece, i == len(pieces) - 1)
        delays += [t - times[0]] * len(text)
        if stopped:
            break
    return delays


def delays_off_by_one(pieces, times, checker):  # wrong: the token boundary found with bisect_left
    import bisect

    ends = list(itertools.accumulate(len(p) for p in pieces))
    out, sent = [], 0
    for i, piece in enumerate(pieces):
        text, stopped = checker.add(piece, i == len(pieces) - 1)
        for n in range(sent, sent + len(text)):
            out.append(times[i] - times[min(bisect.bisect_left(ends, n), i)])
        sent += len(text)
        if stopped:
            break
    return out


@pytest.mark.parametrize("fn", [delays_solution, delays_by_bisect])
def test_char_delays_accepts(fn, capsys):
    checks.check_char_delays(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, cause",
    [
        (delays_all_zero, "runs from the token that brought it"),
        (delays_per_chunk, "one delay per character"),
        (delays_after_stop, "sends nothing more"),
        (delays_never_final, "the last token is final"),
        (delays_token_index, "which token brought it"),
        (delays_from_first_token, "which token brought it"),
        (delays_off_by_one, "which token brought it"),
    ],
)
def test_char_delays_rejects(fn, cause):
    with pytest.raises(AssertionError, match=cause):
        checks.check_char_delays(fn)


# ---- part 3: the most a checker ever holds back ----------------------------------------------
def hold_by_prefixes(stops):  # the solution
    best = 0
    for s in stops:
        for n in range(1, len(s)):
            if any(t in s[:n] for t in stops):
                break
            best = max(best, n)
    return best


def hold_by_feeding(stops):
    """Right, written differently: feed each proper beginning of a stop string to a fresh checker
    that follows part 1's rule and measure what it holds."""
    held = [0]
    for s in stops:
        for n in range(1, len(s)):
            sent, stopped = checks.StopReference(stops).add(s[:n], False)
            if not stopped:
                held.append(n - len(sent))
    return max(held)


WRONG_HOLD = {
    "the fixed window": (lambda st: max(map(len, st), default=1) - 1, "no stream makes"),
    "only a stop at the end": (  # a beginning that ends with a stop string is never held
        lambda st: max(
            (n for s in st for n in range(1, len(s)) if not any(s[:n].endswith(t) for t in st)),
            default=0,
        ),
        "no stream makes",
    ),
    "the longest stop only": (
        lambda st: hold_by_prefixes([max(st, key=len)]) if st else 0,
        "no stream makes",
    ),
    "one short": (
        lambda st: max(
            (n for s in st for n in range(1, len(s) - 1) if not any(t in s[:n] for t in st)),
            default=0,
        ),
        "holds back 2 characters",
    ),
    "max of nothing": (lambda st: max(hold_by_prefixes([s]) for s in st), "ValueError"),
    "a float": (lambda st: float(hold_by_prefixes(st)), "whole number"),
}


@pytest.mark.parametrize("fn", [hold_by_prefixes, hold_by_feeding])
def test_longest_hold_back_accepts(fn, capsys):
    checks.check_longest_hold_back(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("case", WRONG_HOLD.values(), ids=WRONG_HOLD.keys())
def test_longest_hold_back_rejects(case):
    fn, words = case
    with pytest.raises(AssertionError, match=words):
        checks.check_longest_hold_back(fn)
