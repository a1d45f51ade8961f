"""The page the server shows at / (a lecture audience's prompt box), in headless Debian Chromium.

Type a name and a prompt, press Send: the answer streams in, the page reports its first
token and token count, and the request is on the engine's timeline under the typed name
(the live Gantt's row). On a server with a key, the page asks for it once and keeps it for
the visit. Skipped, saying so, where /usr/bin/chromium is absent.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS
from serving import docstrings_engine, serving, wait_idle

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"{CHROMIUM} is absent: install it with `apt-get install -y chromium`",
)


MODEL_SHOWN = "document.getElementById('model').textContent === 'docstrings'"


@contextmanager
def browser_at(url: str):
    """Chromium with one page open at the server's `/`: (browser, page); closed on the way out."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(url + "/")
            yield browser, page
        finally:
            browser.close()


def send(page, name: str) -> tuple[str, str]:
    """Type a name and a prompt, press Send, wait for the whole answer: (the stats line, the answer)."""
    page.fill("#user", name)
    page.fill("#prompt", "Return the number of")
    page.fill("#max_tokens", "12")
    page.fill("#temperature", "0")
    page.click("#send")
    page.wait_for_function("document.getElementById('stats').textContent.includes('length')")
    return page.text_content("#stats"), page.text_content("#out b")


def test_the_page_streams_an_answer_and_the_request_is_named_after_the_user():
    with serving(docstrings_engine(max_num_seqs=4)) as (url, engine, _):
        with browser_at(url) as (_, page):
            page.wait_for_function(MODEL_SHOWN)
            assert page.is_hidden("#keyrow")  # no key asked of a server without one
            stats, answer = send(page, "grace")
            send(page, "")  # no name: an anonymous row
        wait_idle(engine)
    record = next(r for r in engine.timeline.requests if r.request_id.startswith("grace-"))
    assert record.output_len == 12 and "12 tokens" in stats and "first token after" in stats
    assert answer == engine.tokenizer.decode(record.output_ids) and answer.strip()
    assert [r.request_id.split("-")[0] for r in engine.timeline.requests] == ["grace", "req"]


def test_on_a_keyed_server_the_page_asks_for_the_key_once_per_visit():
    key = "slide-key"
    with serving(docstrings_engine(max_num_seqs=4), api_key=key) as (url, engine, _):
        with browser_at(url) as (browser, page):
            page.wait_for_selector("#keyrow", state="visible")  # /v1/models answered 401
            asked = page.text_content("#keynote")
            page.fill("#key", "a-wrong-guess")
            page.click("#usekey")
            page.wait_for_function(
                "document.getElementById('keynote').textContent.includes('not accepted')"
            )
            page.fill("#key", key)
            page.click("#usekey")
            page.wait_for_function(MODEL_SHOWN)
            stats, answer = send(page, "ada")
            page.reload()  # the same visit: the key is kept (sessionStorage), not asked again
            page.wait_for_function(MODEL_SHOWN)
            hidden_after_reload = page.is_hidden("#keyrow")
            stats_again, _ = send(page, "ada")
            fresh = browser.new_page()  # another visit (a new tab's session): asked again
            fresh.goto(url + "/")
            fresh.wait_for_selector("#keyrow", state="visible")
        wait_idle(engine)
    assert "asks for its key" in asked and hidden_after_reload
    assert "12 tokens" in stats and "12 tokens" in stats_again and answer.strip()
    assert [r.request_id.split("-")[0] for r in engine.timeline.requests] == ["ada", "ada"]
