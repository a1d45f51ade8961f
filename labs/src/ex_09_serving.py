# %% [markdown]
# # Exercise 9 · Stop strings on a stream
#
# The engine knows tokens; a client's `stop` strings are text. The server (lesson 9)
# turns each new token into text and searches it, and a stop string may be split across
# tokens: `"\n\n"` can arrive as `"\n"` and then `"\n"`. Text that *might* be the start of a
# stop string therefore cannot be sent yet, and no text after a stop string may ever be
# sent. The server's own checker (`StopChecker` in `minilm/serve/detokenizer.py`, like
# vLLM's) holds back a fixed window: the longest stop string's length minus one, whatever
# the text is. A client then waits for characters that could never start a stop string.
#
# ## Part 1: hold back only what could start a stop string
#
# Write `MyStopChecker(stops, include_stop_str_in_output=False)` with one method,
# `add(text, final) -> (send, stopped)`: `text` is the next token's text, `final` says it is
# the last one. Return the text that may be sent now and whether a stop string was found
# (then the request ends and nothing more is sent). The rules:
#
# - Hold back only the longest end of the text so far that is the beginning of some stop
#   string (`"ab"` can start the stop string `"abc"`; `"b"` cannot), and send the rest.
# - When the text holds a stop string, stop there; if it holds several, the one that
#   starts first (of two that start at the same place, the shorter: it ends first). Send
#   what comes before it and, with `include_stop_str_in_output=True` (vLLM's option,
#   which the lab's server does not have), the stop string too.
# - With `final=True`, nothing is held back any more.
#
# Stop strings are never empty (the server refuses an empty one: it would stop at once).
#
# Before you code: stops `["abc"]`, pieces `"xa"`, `"b"`, `"d"`: what is sent after each?
# And stops `["cd", "bcdx"]`, pieces `"abc"`, `"d"`?

# %%
from labs import checks


class MyStopChecker:
    def __init__(self, stops: list[str], include_stop_str_in_output: bool = False):
        # BEGIN SOLUTION
        self.stops, self.include, self.held = stops, include_stop_str_in_output, ""
        # END SOLUTION

    def add(self, text: str, final: bool) -> tuple[str, bool]:
        # BEGIN SOLUTION
        text = self.held + text
        found = [(text.find(s), s) for s in self.stops if s in text]
        if found:
            start, stop = min(found, key=lambda f: (f[0], len(f[1])))
            return text[:start + len(stop) if self.include else start], True
        keep = 0 if final else max((n for s in self.stops for n in range(1, min(len(s), len(text) + 1))
                                    if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep], False
        # END SOLUTION

# %%
# exercise check
checks.check_stop_checker(MyStopChecker)

# %% [markdown]
# ## Part 2: what holding back costs a client, character by character
#
# A recorded stream: `pieces[i]` is token `i`'s text and `times[i]` the time (in seconds) the
# server had it. The server hands each piece to a stop checker (`checker.add(piece, final)`,
# the last piece final) and sends what it returns at once; once the checker says stopped, it
# sends nothing more. Write `char_delays(pieces, times, checker)`: for each character the client
# receives, in order, how long after its token reached the server it was sent (seconds). A
# character sent with the token that brought it has delay `0`.
#
# The check calls it with the server's fixed-window `StopChecker` and with a checker that
# follows part 1's rule, on made-up streams (times included), and compares the two. Its
# streams include tokens with no text, a stop string split across tokens, one that ends
# inside a token (with `include_stop_str_in_output` both ways), and text still held back
# when the final token comes.

# %%
def char_delays(pieces: list[str], times: list[float], checker) -> list[float]:
    # BEGIN SOLUTION
    arrived = [t for piece, t in zip(pieces, times) for _ in piece]  # each character's token time
    delays = []
    for i, (piece, t) in enumerate(zip(pieces, times)):
        text, stopped = checker.add(piece, i == len(pieces) - 1)
        # what is sent is always the next stretch of the tokens' text (a stop only cuts it short)
        delays += [t - arrived[n] for n in range(len(delays), len(delays) + len(text))]
        if stopped:
            break
    return delays
    # END SOLUTION

# %%
# exercise check
checks.check_char_delays(char_delays)

# %% [markdown]
# ## Part 3: the most a checker ever holds back
#
# A client wants a bound it can promise its users: with these stop strings, how far can the
# text it shows ever lag behind the text the server has? Write `longest_hold_back(stops)`:
# the largest number of characters a checker that follows part 1's rule holds back at once
# (after an `add(..., final=False)` that did not stop), over **every** stream: any text, cut
# into any pieces. `0` when it never holds anything (no stop strings, or only one-character
# ones).
#
# The server's fixed window says: the longest stop string's length minus one. The check's
# stop strings are chosen so that this bound is too large for some of them, and asks for the
# exact largest. It does not run a stream: it compares your number with a reference in
# `labs/checks.py`.

# %%
def longest_hold_back(stops: list[str]) -> int:
    # BEGIN SOLUTION
    # a held end is a proper beginning of a stop string; one that holds a stop string anywhere
    # in it is never held (the stream stopped there), nor is anything longer that starts alike
    best = 0
    for s in stops:
        for n in range(1, len(s)):
            if any(t in s[:n] for t in stops):
                break
            best = max(best, n)
    return best
    # END SOLUTION

# %%
# exercise check
checks.check_longest_hold_back(longest_hold_back)

# %% [markdown]
# ## Think further
#
# - Part 2's check compared the two checkers on made-up times. Record a real stream (the
#   `docstrings` model through the server, lesson 9) and measure the same with the stop string
#   `"\n\n"` and with `"Returns"`.
# - A token's text is not always final: a multi-byte character split across two tokens
#   decodes to a replacement character until its second half arrives. How does the
#   server's detokenizer (`minilm/serve/detokenizer.py`) deal with that, and what would
#   your checker do without it?

# %% [markdown]
# <details><summary>Hint for Part 3 (open it if you are stuck)</summary>
#
# Which texts can a checker hold back whole? Take the stop strings `["abcde", "b"]`: feed
# your checker `"a"`, then `"ab"`, `"abc"`, `"abcd"` (each as a fresh stream) and look at
# what it holds and when it stops.
#
# </details>
