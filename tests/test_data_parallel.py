"""Data-parallel engine cores behind one server (`serve --data-parallel-size 2`; issue 28).

Real servers on free ports, each engine core a real process with its own model copy, scheduler
and KV cache, one CPU thread each; the tiny docstrings model.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import free_port, serving_process, wait_healthy

from minilm import Engine, Timeline
from minilm.router import RoutedPrefixes
from minilm.serve.engine_client import load
from minilm.workload import DOCSTRINGS_HELDOUT, docstring_prompt

PROMPTS = [docstring_prompt(d) for d in json.loads(DOCSTRINGS_HELDOUT.read_text())[:4]]
LONG = {"prompt": "Return the", "max_tokens": 200, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def dp_server():
    with serving_process(data_parallel_size=2, max_num_seqs=16) as s:
        yield s


def offline(prompts: list[str], max_tokens: int) -> list[str]:
    """One engine's greedy output, no server: what N = 1 serves (tests/test_server.py checks)."""
    return Engine("docstrings", max_num_seqs=4).generate(prompts, max_tokens=max_tokens)


def metrics(url: str) -> dict[tuple[str, str, tuple], float]:
    """Every sample of /metrics by (sample name, engine label, its other labels but model_name)."""
    return {
        (
            s.name,
            s.labels.get("engine"),
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name"))),
        ): s.value
        for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
        for s in f.samples
    }


def timelines(url: str) -> list[Timeline]:
    """Each engine core's /timeline, finished and unfinished requests together."""
    out = []
    for engine in (0, 1):
        data = httpx.get(f"{url}/timeline", params={"engine": engine}).json()
        assert data["engine"] == engine and data["data_parallel_size"] == 2
        assert data["meta"]["replica"] == f"engine {engine}"
        out.append(Timeline.from_dict({**data, "requests": data["requests"] + data["unfinished"]}))
    return out


def wait_idle(client, timeout: float = 60) -> None:
    """Until every stream has had its last event and both cores' gauges say nothing runs."""
    deadline = time.monotonic() + timeout
    while client.streams or any(c.outstanding for c in client.cores):
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not become idle")
        time.sleep(0.02)


async def complete(http: httpx.AsyncClient, body: dict, rid: str | None = None) -> list[str]:
    """The texts of each choice, streamed or not."""
    headers = {"X-Request-Id": rid} if rid else {}
    r = await http.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        return [c["text"] for c in r.json()["choices"]]
    texts = [""] * body.get("n", 1)
    for line in r.text.split("\n\n"):
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                texts[c["index"]] += c["text"]
    return texts


def test_requests_spread_over_both_cores_with_one_engines_greedy_text(dp_server):
    url, client = dp_server
    expected = offline(PROMPTS, 24)

    async def all_at_once():
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            bodies = [
                {"prompt": p, "max_tokens": 24, "temperature": 0, "stream": s, "n": n}
                for p in PROMPTS
                for s, n in ((True, 1), (False, 1), (True, 2))
            ]
            return await asyncio.gather(*(complete(http, b) for b in bodies))

    routed = len(client.routes)
    results = asyncio.run(all_at_once())
    for i, texts in enumerate(results):
        assert texts == [expected[i // 3]] * len(texts)  # n = 2 too: greedy choices agree
    assert any(len(t) > 20 for t in expected)  # real text
    decisions = list(client.routes)[routed:]
    assert Counter(d.replica for d in decisions).keys() == {0, 1}
    wait_idle(client)
    a, b = timelines(url)
    # a request and its n choices go to one core: their shared prompt is computed once there
    for tl in (a, b):
        ids = {r.request_id for r in tl.requests}
        for rid in ids:
            if rid.endswith(".0"):
                assert rid[:-2] + ".1" in ids


def test_least_outstanding_spreads_concurrent_requests_evenly_and_sequential_ones_not(dp_server):
    """Concurrent requests alternate (each core has one more outstanding in turn); one at a time,
    every core has none outstanding, and the lowest index wins: the choice reads the load."""
    url, client = dp_server
    wait_idle(client)
    routed = len(client.routes)

    async def concurrent():
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            body = {"prompt": "Return the", "max_tokens": 30, "ignore_eos": True}
            await asyncio.gather(*(complete(http, body) for _ in range(8)))

    asyncio.run(concurrent())
    decisions = list(client.routes)[routed:]
    assert Counter(d.replica for d in decisions) == {0: 4, 1: 4}
    assert all(d.reason.endswith("the fewest") for d in decisions)
    for _ in range(3):
        httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    assert [d.replica for d in list(client.routes)[-3:]] == [0, 0, 0]
    assert [load(c).max_num_seqs for c in client.cores] == [16, 16]  # the seats a router sees


def test_an_abort_frees_the_kv_of_the_core_that_served_it(dp_server):
    url, client = dp_server
    wait_idle(client)
    # one long request keeps core 0 busy, so least_outstanding sends the leaver to core 1
    with httpx.Client(base_url=url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=LONG, headers={"X-Request-Id": "stay"}):
            with http.stream(
                "POST", "/v1/completions", json=LONG, headers={"X-Request-Id": "leaver"}
            ) as r:
                got = 0
                for line in r.iter_lines():
                    got += line.startswith("data: {")
                    if got == 3:
                        break  # leaving the block closes the connection mid-stream
            core = next(d.replica for d in reversed(client.routes) if d.request_id == "leaver")
    wait_idle(client)
    before = metrics(url)
    a, b = timelines(url)
    record = next(r for r in (a, b)[core].requests if r.request_id == "leaver")
    assert record.finish_reason == "aborted" and 3 <= record.output_len < 200
    assert not any(r.request_id == "leaver" for r in (a, b)[1 - core].requests)
    assert before[("vllm:kv_cache_usage_perc", str(core), ())] == 0
    assert before[("vllm:num_requests_running", str(core), ())] == 0
    aborted = ("vllm:request_success_total", str(core), (("finished_reason", "aborted"),))
    assert before[aborted] >= 1


def test_metrics_are_labelled_by_engine_core_and_match_each_cores_timeline(dp_server):
    url, client = dp_server
    wait_idle(client)
    values = metrics(url)
    for engine, tl in zip(("0", "1"), timelines(url)):
        assert values[("vllm:num_requests_running", engine, ())] == 0
        # the window holds every request so far (fewer than --timeline-window)
        assert values[("vllm:generation_tokens_total", engine, ())] == sum(
            r.output_len for r in tl.requests
        )
        for reason, n in Counter(r.finish_reason for r in tl.requests).items():
            key = ("vllm:request_success_total", engine, (("finished_reason", reason),))
            assert values[key] == n


def test_no_request_lost_or_finished_twice_and_ids_unique_across_cores(dp_server):
    url, client = dp_server
    wait_idle(client)
    ids = [f"unique-{i}" for i in range(16)]

    async def all_at_once():
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            body = {"prompt": "Return the", "max_tokens": 12, "ignore_eos": True, "stream": True}
            await asyncio.gather(*(complete(http, body, rid) for rid in ids))

    asyncio.run(all_at_once())
    wait_idle(client)
    seen = Counter(
        (r.request_id, i, r.finish_reason)
        for i, tl in enumerate(timelines(url))
        for r in tl.requests
        if r.request_id.startswith("unique-")
    )
    assert sorted(rid for rid, _, _ in seen) == sorted(ids)  # each once, on one core
    assert {reason for _, _, reason in seen} == {"length"} and set(seen.values()) == {1}
    assert {core for _, core, _ in seen} == {0, 1}
    # an id in flight on one core cannot start on the other: it goes where its twin is, and is refused
    with httpx.Client(base_url=url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=LONG, headers={"X-Request-Id": "twin"}):
            again = http.post(
                "/v1/completions",
                json={"prompt": "x", "max_tokens": 2},
                headers={"X-Request-Id": "twin"},
            )
    assert again.status_code == 400 and "'twin'" in again.json()["error"]["message"]


def test_seeds_stop_strings_and_logprobs_are_the_same_on_either_core(dp_server):
    """Sent together, twins go to different cores (least_outstanding) and still agree."""
    url, client = dp_server
    wait_idle(client)
    routed = len(client.routes)
    sampled = {"prompt": PROMPTS[2], "max_tokens": 16, "temperature": 1.0, "seed": 7}
    greedy = {"prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0, "logprobs": 2}

    async def twins(body: dict):
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            rs = await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(2)))
        return [r.json()["choices"][0] for r in rs]

    a, b = asyncio.run(twins(sampled))
    assert a["text"] == b["text"]
    full = offline(PROMPTS[2:3], 16)[0]
    a, b = asyncio.run(twins(greedy))
    assert a["logprobs"] == b["logprobs"] and a["text"] == b["text"] == full
    stop = full[4:8]
    a, b = asyncio.run(twins({**greedy, "stop": [stop]}))
    assert a["text"] == b["text"] == full[: full.index(stop)] and a["finish_reason"] == "stop"
    assert [d.replica for d in list(client.routes)[routed:]] == [0, 1] * 3


def test_both_cores_count_time_from_one_origin(dp_server):
    """The lane groups share one time axis: each core's clock starts at the moment the server
    started them all, not when each finished loading its model."""
    url, _ = dp_server
    t = time.perf_counter()
    nows = [httpx.get(f"{url}/timeline", params={"engine": e}).json()["now"] for e in (0, 1)]
    assert abs(nows[1] - nows[0]) <= time.perf_counter() - t


def test_bad_engine_index_for_the_timeline_is_a_400(dp_server):
    url, _ = dp_server
    r = httpx.get(f"{url}/timeline", params={"engine": 2})
    assert r.status_code == 400 and "engine=2" in r.json()["error"]["message"]


def test_a_killed_core_fails_only_its_requests_and_the_other_goes_on_serving():
    with serving_process(data_parallel_size=2) as (url, client):

        async def one(http, rid: str, kill: bool) -> list[str]:
            lines = []
            async with http.stream(
                "POST", "/v1/completions", json=LONG, headers={"X-Request-Id": rid}
            ) as r:
                async for line in r.aiter_lines():
                    if line:
                        lines.append(line)
                    if kill and len(lines) == 3:
                        os.kill(client.pids[1], signal.SIGKILL)
            return lines

        async def both():
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                first = asyncio.create_task(one(http, "on-0", False))
                while not client.streams:  # on-0 is placed first: core 0
                    await asyncio.sleep(0.01)
                return await asyncio.gather(first, one(http, "on-1", True))

        survivor, victim = asyncio.run(both())
        assert [d.replica for d in client.routes][-2:] == [0, 1]
        assert victim[-1] == "data: [DONE]"
        error = json.loads(victim[-2][6:])["error"]
        assert (
            "the engine stopped" in error["message"] and "exited with code -9" in error["message"]
        )
        assert survivor[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in survivor[:-1]]
        assert len(chunks) == 200 and chunks[-1]["choices"][0]["finish_reason"] == "length"
        # the router sends nothing more to the dead core; the server keeps serving
        assert httpx.get(f"{url}/health").status_code == 200
        routed = len(client.routes)

        async def more():
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                body = {"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0}
                return await asyncio.gather(*(complete(http, body) for _ in range(4)))

        assert asyncio.run(more()) == [offline(PROMPTS[:1], 16)] * 4
        assert len(client.routes) == routed  # one core left: nothing to choose between
        assert httpx.get(f"{url}/timeline", params={"engine": 1}).status_code == 503
        tl = httpx.get(f"{url}/timeline", params={"engine": 0}).json()
        assert len(tl["requests"]) == 5 and not tl["unfinished"]
        values = metrics(url)
        finished = [
            v
            for (name, engine, _), v in values.items()
            if name == "vllm:request_success_total" and engine == "0"
        ]
        assert sum(finished) == 5


def test_routed_prefixes_match_whole_blocks_of_prompts_sent_before():
    seen = RoutedPrefixes(block_size=4, capacity=3)
    seen.add(list(range(10)))  # two full blocks: 0-3, 4-7
    assert seen.match(list(range(12))) == 8 and seen.match([0, 1, 2, 3, 9, 9, 9, 9]) == 4
    assert seen.match([1, 2, 3, 4]) == 0  # a block is named by its parents too
    seen.add([7] * 8)  # two more names: the oldest (0-3) leaves
    assert seen.match(list(range(8))) == 0 and seen.match([7] * 8) == 8


def test_ctrl_c_drains_every_core_and_each_writes_its_timeline(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the engine cores ignore it and the
    server drains them. `--router prefix_aware` sends a prompt sent before back to its core."""
    port, path = free_port(), tmp_path / "run.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["--data-parallel-size", "2", "--router", "prefix_aware", "--timeline", str(path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "minilm", "serve", "--port", str(port), "--drain-timeout", "30"]
        + args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)

        async def run():
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                # a prompt of several full KV blocks (16 tokens each): what the router remembers
                body = {"prompt": "\n".join(PROMPTS * 2), "max_tokens": 40, "ignore_eos": True}
                body["stream"] = True
                first = asyncio.create_task(complete(http, body, "first"))
                await asyncio.sleep(0.5)  # first is in flight on core 0 (the least loaded)
                twin = asyncio.create_task(complete(http, body, "same-prompt"))
                other = asyncio.create_task(
                    complete(http, {**body, "prompt": "Compute the"}, "other-prompt")
                )
                await asyncio.sleep(0.5)
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, to every process of the group
                return await asyncio.gather(first, twin, other)

        texts = asyncio.run(run())
        assert proc.wait(60) == 0, proc.communicate()[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert all(len(t[0]) > 0 for t in texts)  # drained: each finished, none cut
    cores = [Timeline.from_json(tmp_path / f"run.engine{i}.json") for i in (0, 1)]
    where = {r.request_id: i for i, tl in enumerate(cores) for r in tl.requests}
    assert where == {"first": 0, "same-prompt": 0, "other-prompt": 1}
    assert all(r.finish_reason == "length" for tl in cores for r in tl.requests)


def test_live_gantt_draws_a_lane_group_per_engine_core(dp_server):
    import widgets

    url, client = dp_server
    wait_idle(client)

    async def scenario():
        live = widgets.live_gantt(url, interval=0.05)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            body = {"prompt": "Return the", "max_tokens": 20, "ignore_eos": True}
            await asyncio.gather(*(complete(http, body, f"lane{i}") for i in range(4)))
        await live.refresh()
        live.stop()
        return live

    live = asyncio.run(scenario())
    assert [f.engine for f in live.feeds] == [0, 1]
    ids = [
        {r.request_id for r in f.timeline.requests if r.request_id.startswith("lane")}
        for f in live.feeds
    ]
    assert ids[0] | ids[1] == {f"lane{i}" for i in range(4)} and ids[0] and ids[1]
    assert not ids[0] & ids[1]
    titles = [a.text for a in live.gantt.layout.annotations]
    assert any(t.startswith("engine 0:") for t in titles) and any(
        t.startswith("engine 1:") for t in titles
    )
    drawn = {y for t in live.gantt.data if t.name == "decode" for y in t.y}
    assert {f"lane{i}" for i in range(4)} <= drawn
    assert "2 engine cores" in live.status.value


def test_bad_data_parallel_flags_are_refused_before_any_server_starts(capsys):
    from minilm.cli import main

    assert main(["serve", "--data-parallel-size", "0"]) == 2
    assert "--data-parallel-size=0: must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--data-parallel-size", "2", "--engine-core", "thread"]) == 2
    assert "several need --engine-core process" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--router", "random"])
    assert "invalid choice: 'random'" in capsys.readouterr().err


def test_the_router_flag_picks_the_policy():
    """round_robin alternates even one request at a time, where least_outstanding keeps core 0."""
    with serving_process(data_parallel_size=2, router="round_robin") as (url, client):
        for _ in range(4):
            r = httpx.post(
                f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60
            )
            assert r.status_code == 200
        assert [d.replica for d in client.routes] == [0, 1, 0, 1]
        assert client.routes[0].reason.startswith("its turn")
