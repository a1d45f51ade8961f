"""The page the server shows at / (a lecture audience's prompt box), in headless Debian Chromium.

Type a name and a prompt, press Send: the answer streams in, the page reports its first
token and token count, and the request is on the engine's timeline under the typed name
(the live Gantt's row). Skipped, saying so, where /usr/bin/chromium is absent.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from chromium import CHROMIUM, CHROMIUM_ARGS
from serving import docstrings_engine, serving, wait_idle

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} is absent: install it with `apt-get install -y chromium`")


def test_the_page_streams_an_answer_and_the_request_is_named_after_the_user():
    sync_api = pytest.importorskip("playwright.sync_api")
    with serving(docstrings_engine(max_num_seqs=4)) as (url, engine, _):
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.set_default_timeout(30_000)
                page.goto(url + "/")
                page.wait_for_function("document.getElementById('model').textContent === 'docstrings'")
                page.fill("#user", "grace")
                page.fill("#prompt", "Return the number of")
                page.fill("#max_tokens", "12")
                page.fill("#temperature", "0")
                page.click("#send")
                page.wait_for_function("document.getElementById('stats').textContent.includes('length')")
                stats, answer = page.text_content("#stats"), page.text_content("#out b")
            finally:
                browser.close()
        wait_idle(engine)
    record = next(r for r in engine.timeline.requests if r.request_id.startswith("grace-"))
    assert record.output_len == 12 and "12 tokens" in stats and "first token after" in stats
    assert answer == engine.tokenizer.decode(record.output_ids) and answer.strip()
