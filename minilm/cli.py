"""Command line: `python -m minilm run|compare|serve|bench-serve|capacity ...` (see docs/USAGE.md).

    run          one policy on a workload: completions, a metrics table, a timeline
    compare      one workload under several policies: one table (--replicas N --router R, or
                 --disaggregate P:D --link L: a simulated fleet a row, sim/cluster.py)
    serve        an OpenAI-compatible HTTP server over one engine, or N (--data-parallel-size N)
    bench-serve  load any OpenAI-compatible server from the client side (client/bench_serve.py)
    capacity     the cheapest simulated deployment that serves a load within SLOs (sim/search.py)

`python -m widgets.report` takes `compare`'s arguments and writes an HTML report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

from .config import EngineConfig, InvalidValue
from .core.builder import resolve
from .core.engine import Engine
from .core.policies import POLICIES
from .metrics import metrics_text, summarize
from .router import ROUTERS
from .serve.history import DEFAULT_WINDOW
from .sim.cluster import Cluster, FleetRun, fleet_summary, replica_summaries
from .sim.disaggregation import LINK_NAMES, Disaggregated, receive_kv
from .sim.executor import simulated_engine
from .timeline import Timeline
from .trace import save_trace
from .workload import PRESETS, get_workload, recommended_knobs


# ---- arguments ---------------------------------------------------------------------
def add_engine_args(p: argparse.ArgumentParser, skip: tuple = (), **defaults) -> None:
    """A flag for each EngineConfig field (max_num_seqs: --max-num-seqs) but `skip`, its help from
    the field's; a flag left out is None, so the field's own default holds (engine_config), unless
    the command has one of its own in `defaults` (serve's prefix caching)."""
    for f in fields(EngineConfig):
        if f.name in skip:
            continue
        default = defaults.get(f.name)  # None: left out, so EngineConfig's own
        shown = f.default if default is None else default
        shown = "" if shown is None else f" (default: {shown})"
        kind = f.type.removesuffix(" | None")
        # the allowed values shown, not checked here: EngineConfig.resolve says what is wrong
        choices = list(POLICIES) if f.name == "policy" else [c for c in f.metadata["choices"] if c]
        kwargs = (
            {"action": argparse.BooleanOptionalAction}
            if kind == "bool"
            else {"type": {"int": int, "float": float}.get(kind, str)}
        )
        if choices:
            kwargs["metavar"] = "|".join(choices)
        if f.name == "speculative_config":
            kwargs |= {"type": json_object, "metavar": "JSON"}
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            default=default,
            help=f.metadata["help"] + shown,
            **kwargs,
        )


def add_offline_args(p: argparse.ArgumentParser, compare: bool) -> None:
    """run's and compare's: a workload, the engine, and how to show the result."""
    p.add_argument(
        "--workload",
        default="mixed",
        help=f"preset ({', '.join(PRESETS)}) or a JSON file of requests",
    )
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Poisson arrivals, requests/s (default: all at t=0)",
    )
    p.add_argument(
        "--ignore-eos", action="store_true", help="always generate max_tokens (benchmarks)"
    )
    p.add_argument("--temperature", type=float, default=0.0)
    if compare:  # a sweep: each policy with prefix caching off, on, or both
        p.add_argument(
            "--enable-prefix-caching",
            dest="prefix_caching",
            nargs="?",
            const="on",
            default="off",
            choices=["off", "on", "both"],
            help="share cached prompt prefixes (vLLM's flag); 'both' runs each policy off and on",
        )
    p.add_argument(
        "--simulate",
        action="store_true",
        help="no model: step times from the roofline cost model "
        "(minilm/sim/costmodel.py); --model then names a model spec (llama-3-8b, llama-3-70b, ...)",
    )
    p.add_argument("--tp", type=int, default=1, help="with --simulate: GPUs in tensor parallel")
    p.add_argument(
        "--acceptance",
        type=acceptance_arg,
        default=None,
        metavar="ALPHA|TIMELINE",
        help="with --simulate and --speculative-config: each draft's acceptance probability in [0, 1], "
        "or a timeline JSON of a run with speculation whose acceptance to replay",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="with --simulate: auto (the weights' dtype) or fp8, "
        "one byte per K/V number (vLLM's flag)",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object per run instead of a table"
    )
    p.add_argument(
        "--model",
        default="tiny",
        help="preset (tiny, small), shipped checkpoint name, or HF checkpoint dir; with --simulate "
        "a model spec (llama-3-8b, llama-3-70b, ...)",
    )
    add_engine_args(p, ("policy", "enable_prefix_caching") if compare else ())


def engine_config(args, preset: dict | None = None, **knobs) -> EngineConfig:
    """The knobs the command line gives, over `preset` (a workload's recommended knobs), under
    `knobs` (what compare varies); a knob given nowhere keeps EngineConfig's default."""
    given = {f.name: getattr(args, f.name, None) for f in fields(EngineConfig)}
    return EngineConfig(
        **(preset or {}) | {k: v for k, v in given.items() if v is not None} | knobs
    )


def acceptance_arg(text: str) -> float | Timeline:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return Timeline.from_json(Path(text))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise argparse.ArgumentTypeError(
            f"neither a number nor a timeline JSON file ({e}): {text!r}"
        ) from None


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, not {text!r}")
    return value


# ---- run and compare ----------------------------------------------------------------
def build_engine(args, **knobs) -> Engine:
    policy = engine_config(args, **knobs).policy
    config = engine_config(
        args, recommended_knobs(args.workload, args.num_requests, policy), **knobs
    )
    if args.simulate:  # --dtype left out: the simulated device's serving dtype (bfloat16 on GPUs)
        return simulated_engine(
            args.model,
            config.device,
            config=config,
            dtype=args.dtype,
            tp=args.tp,
            acceptance=args.acceptance,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    if args.acceptance is not None:
        raise InvalidValue(
            "--acceptance",
            args.acceptance,
            "only with --simulate: a real model's drafts are accepted or not by the model",
        )
    if args.kv_cache_dtype != "auto":
        raise InvalidValue(
            "kv_cache_dtype",
            args.kv_cache_dtype,
            "only with --simulate: the engine's KV cache is in --dtype",
        )
    return Engine(args.model, config)


def run_one(args, **knobs) -> tuple[Engine, dict]:
    engine = build_engine(args, **knobs)
    specs = get_workload(
        args.workload,
        num_requests=args.num_requests,
        seed=engine.config.seed,
        vocab_size=engine.model_config.vocab_size,
        rate=args.rate,
        max_model_len=engine.config.max_model_len,
    )
    sampling = {
        "ignore_eos": args.ignore_eos,
        "temperature": args.temperature,
        "seed": engine.config.seed if args.temperature > 0 else None,
    }
    engine.add_workload(specs, **sampling)
    timeline = engine.run(progress=not args.json)
    m = summarize(timeline) | {"max_num_batched_tokens": engine.config.max_num_batched_tokens}
    if engine.config.enable_prefix_caching:
        m["policy"] += " +prefix cache"
    return engine, m


def describe_run(meta: dict) -> str:
    """One line saying what the numbers are: simulated ones must say so."""
    times = (
        "SIMULATED times (roofline cost model)"
        if meta.get("clock") == "simulated"
        else "measured times"
    )
    quantized = f", {meta['quantization']} weights" if meta.get("quantization") else ""
    return (
        f"model {meta['model']} on {meta['device']} ({meta['dtype']}{quantized}), {times}; "
        f"max_num_seqs={meta['max_num_seqs']}, block_size={meta['block_size']}"
    )


def print_table(rows: list[dict]) -> None:
    """The metrics table (minilm/metrics.py: METRIC_COLUMNS), a line per run, named by its policy."""
    print(metrics_text({m["policy"]: m for m in rows}))


def compare(args) -> dict[str, Timeline]:
    """Every policy of `--policies` (with and without prefix caching for `both`): prints the
    table (or JSON lines) and returns the timelines by row name. With --replicas or
    --disaggregate, each row is a simulated fleet (run_fleet)."""
    if args.replicas != 1 or args.disaggregate:
        return compare_fleets(args)
    rows, timelines = [], {}
    caching = {"off": [False], "on": [True], "both": [False, True]}[args.prefix_caching]
    for policy in args.policies.split(","):
        for prefix_caching in caching:
            engine, m = run_one(args, policy=policy.strip(), enable_prefix_caching=prefix_caching)
            rows.append(m)
            timelines[m["policy"]] = engine.timeline
            if args.json:
                print(json.dumps(m))
    if not args.json:
        print(describe_run(engine.timeline.meta))
        print_table(rows)
    return timelines


# ---- a simulated fleet: replicas behind a router, or prefill/decode pools (sim/cluster.py) --
def pools_arg(text: str) -> tuple[int, int]:
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be PREFILL:DECODE replica counts, e.g. 1:3, not {text!r}"
        ) from None
    if p < 1 or d < 1:
        raise argparse.ArgumentTypeError(f"each pool needs at least one replica, not {text!r}")
    return p, d


def build_fleet(args, **knobs):
    """`--replicas` engines behind `--router`, or (`--disaggregate P:D`) P prefill engines
    running `knobs` (the policy) and D decode engines, joined by `--link`."""
    if not args.simulate:
        raise InvalidValue(
            "--replicas" if args.replicas != 1 else "--disaggregate",
            args.replicas if args.replicas != 1 else args.disaggregate,
            "only with --simulate: a fleet is simulated on one clock",
        )
    if args.disaggregate:
        p, d = args.disaggregate
        prefill = [build_engine(args, **knobs) for _ in range(p)]
        # the decode side runs no prompts: --max-num-batched-tokens is the prefill side's
        decode_args = argparse.Namespace(**vars(args) | {"max_num_batched_tokens": None})
        decode = [
            receive_kv(build_engine(decode_args, policy="continuous", enable_prefix_caching=False))
            for _ in range(d)
        ]
        return Disaggregated(prefill, decode, args.link, args.router)
    return Cluster([build_engine(args, **knobs) for _ in range(args.replicas)], args.router)


def run_fleet(args, **knobs) -> tuple[FleetRun, dict]:
    fleet = build_fleet(args, **knobs)
    engine = fleet.replicas[0].engine
    specs = get_workload(
        args.workload,
        num_requests=args.num_requests,
        seed=engine.config.seed,
        vocab_size=engine.model_config.vocab_size,
        rate=args.rate,
        max_model_len=engine.config.max_model_len,
    )
    fleet.add_workload(specs, ignore_eos=args.ignore_eos, temperature=args.temperature)
    run = fleet.run()
    m = fleet_summary(run) | {"max_num_batched_tokens": engine.config.max_num_batched_tokens}
    if engine.config.enable_prefix_caching:
        m["policy"] += " +prefix cache"
    return run, m


def compare_fleets(args) -> dict[str, Timeline]:
    """compare's table with a row per fleet, then a row per replica of each; returns each
    replica's timeline by its row name (so `widgets.report` draws a lane group per replica)."""
    rows, per_replica, timelines = [], [], {}
    caching = {"off": [False], "on": [True], "both": [False, True]}[args.prefix_caching]
    for policy in args.policies.split(","):
        for prefix_caching in caching:
            run, m = run_fleet(args, policy=policy.strip(), enable_prefix_caching=prefix_caching)
            rows.append(m)
            timelines |= {f"{m['policy']}: {n}": tl for n, tl in zip(run.names, run.timelines)}
            replicas = replica_summaries(run)
            per_replica += [r | {"policy": f"{m['policy']}: {n}"} for n, r in replicas.items()]
            if args.json:
                print(json.dumps(m | {"replicas": replicas}))
    if not args.json:
        print(describe_run(run.timelines[0].meta) + f"; fleet of {len(run.timelines)} replicas")
        print_table(rows)
        print("per replica:")
        print_table(per_replica)
    return timelines


def cmd_run(args) -> None:
    engine, m = run_one(args)
    if args.timeline:
        engine.timeline.to_json(args.timeline)
    if args.trace:
        save_trace(engine.timeline, args.trace)
    if args.json:
        print(json.dumps(m))
        return
    for rid in list(engine.requests)[: args.show]:
        req = engine.requests[rid]
        prompt = engine.tokenizer.decode(req.prompt_ids)
        print(
            f"[{rid}] {prompt!r} -> {engine.text(rid)!r} ({req.finish_reason}, {len(req.output_ids)} tokens)"
        )
    print(describe_run(engine.timeline.meta))
    print_table([m])


# ---- serve -------------------------------------------------------------------------
def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="docstrings",
        help="preset (tiny, small), shipped checkpoint name, or HF checkpoint dir",
    )
    # prefix caching on, as vLLM V1 serves (n > 1 choices share their prompt's KV through it)
    add_engine_args(p, enable_prefix_caching=True)
    p.add_argument(
        "--engine-core",
        default="process",
        choices=["process", "thread"],
        help="the engine in a process of its own (vLLM V1's split) or in a thread of the server's",
    )
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="N engine-core processes, each its own model copy, scheduler and KV cache, behind this "
        "one server (vLLM's data parallelism; with --engine-core process)",
    )
    p.add_argument(
        "--router",
        default="least_outstanding",
        choices=list(ROUTERS),
        help="which engine core takes each request, from the load each reports (minilm/router.py)",
    )
    p.add_argument(
        "--kv-transfer-config",
        default=None,
        metavar="JSON",
        help="disaggregated prefill: a prefill and a decode engine core, the prompt's KV sent between "
        'them (serve/kv_transfer.py), e.g. \'{"kv_connector": "ZmqConnector", "kv_port": 14579}\'',
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="0.0.0.0 to let other machines (a lecture audience) in"
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name", default=None, help="the model's name in the API (default: --model)"
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        default=1024,
        help="requests that may wait for a place in the batch; past it, HTTP 429",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=5.0,
        help="on Ctrl-C, seconds in-flight requests get to finish before they are aborted",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="hand a request's tokens to its HTTP stream every N tokens (the first at once), as "
        "vLLM's flag: fewer wake-ups of the HTTP side, burstier streams",
    )
    p.add_argument(
        "--timeline",
        help="write the whole run's timeline JSON here, as it runs (token ids and block tables "
        "included: GET /timeline, the live Gantt's feed, has lengths and times only)",
    )
    p.add_argument(
        "--timeline-window",
        type=int,
        default=DEFAULT_WINDOW,
        metavar="N",
        help="GET /timeline (the live views) keeps the last N steps and N finished requests; "
        "the server forgets the rest, so its memory stays flat (--timeline has them all)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("MINILM_API_KEY") or None,
        help="every route but /, /health, /metrics and /timeline asks for `Authorization: Bearer KEY` "
        "(vLLM's flag; default: $MINILM_API_KEY, which `ps` does not show the machine's other users)",
    )
    p.add_argument(
        "--max-inflight-per-client",
        type=int,
        default=None,
        metavar="N",
        help="at most N requests (n choices count as n) in flight per client address; past it, HTTP 429 "
        "(default: no limit)",
    )
    p.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )
    p.add_argument(
        "--access-log", action="store_true", help="log every HTTP request (uvicorn's access log)"
    )


def cmd_serve(args) -> None:
    if args.stream_interval < 1:
        raise InvalidValue("--stream-interval", args.stream_interval, "must be >= 1")
    if args.max_waiting < 1:
        raise InvalidValue(
            "--max-waiting",
            args.max_waiting,
            "must be >= 1 (a new request waits until the next step)",
        )
    if args.timeline_window < 1:
        raise InvalidValue("--timeline-window", args.timeline_window, "must be >= 1 (records kept)")
    if args.max_inflight_per_client is not None and args.max_inflight_per_client < 1:
        raise InvalidValue(
            "--max-inflight-per-client",
            args.max_inflight_per_client,
            "must be >= 1 (leave it out for no limit)",
        )
    if args.data_parallel_size < 1:
        raise InvalidValue(
            "--data-parallel-size", args.data_parallel_size, "must be >= 1 (engine cores)"
        )
    if args.data_parallel_size > 1 and args.engine_core != "process":
        raise InvalidValue(
            "--data-parallel-size",
            args.data_parallel_size,
            "the thread design runs one engine; several need --engine-core process",
        )
    if args.data_parallel_size > 1 and args.kv_transfer_config is not None:
        raise InvalidValue(
            "--data-parallel-size",
            args.data_parallel_size,
            "a disaggregated pair (--kv-transfer-config) is one prefill and one decode core",
        )
    from .serve.auth import check_api_key
    from .serve.server import serve  # FastAPI and uvicorn only when serving

    if args.api_key is not None:
        check_api_key(args.api_key)
    kv_transfer = None
    if args.kv_transfer_config is not None:
        from .serve.kv_transfer import link_options

        kv_transfer = link_options(args.kv_transfer_config)

    config = engine_config(args)
    resolve(args.model, config)  # bad knobs refused before a server and an engine process start
    serve(
        args.model,
        config,
        name=args.served_model_name,
        host=args.host,
        port=args.port,
        max_waiting=args.max_waiting,
        drain_timeout=args.drain_timeout,
        stream_interval=args.stream_interval,
        timeline_path=args.timeline,
        timeline_window=args.timeline_window,
        engine_core=args.engine_core,
        data_parallel_size=args.data_parallel_size,
        router=args.router,
        log_level=args.log_level,
        access_log=args.access_log,
        api_key=args.api_key,
        max_inflight_per_client=args.max_inflight_per_client,
        kv_transfer=kv_transfer,
    )


# ---- the parser ---------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m minilm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one policy on a workload")
    add_offline_args(p_run, compare=False)
    p_run.add_argument("--timeline", help="write the timeline JSON here")
    p_run.add_argument("--trace", help="write a Chrome trace (open in ui.perfetto.dev) here")
    p_run.add_argument("--show", type=int, default=4, help="print this many completions")
    p_run.set_defaults(func=cmd_run)
    p_cmp = sub.add_parser("compare", help="one workload under several policies")
    add_compare_args(p_cmp)
    p_cmp.set_defaults(func=compare)
    p_serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server over one engine core or several "
        "(--data-parallel-size; minilm/serve/server.py)",
    )
    add_serve_args(p_serve)
    p_serve.set_defaults(func=cmd_serve)
    p_bench = sub.add_parser(
        "bench-serve",
        help="send a workload to an OpenAI-compatible server and measure it "
        "from the client side (minilm/client/bench_serve.py)",
    )
    from .client.bench_serve import add_args as add_bench_args
    from .client.bench_serve import cmd_bench_serve

    add_bench_args(p_bench)
    p_bench.set_defaults(func=cmd_bench_serve)
    from .sim import search  # the cheapest deployment that meets a load (docs/FLEET.md)

    p_cap = sub.add_parser("capacity", help="search deployments for the cheapest within the SLOs")
    search.add_args(p_cap)
    p_cap.set_defaults(func=search.cmd_capacity)
    return parser


def add_compare_args(p: argparse.ArgumentParser) -> None:
    add_offline_args(p, compare=True)
    p.add_argument("--policies", default="static,continuous,chunked")
    p.add_argument(
        "--replicas", type=int, default=1, help="with --simulate: engines behind a router"
    )
    p.add_argument(
        "--router",
        default="round_robin",
        choices=list(ROUTERS),
        help="with --replicas or --disaggregate: the global router (minilm/router.py)",
    )
    p.add_argument(
        "--disaggregate",
        type=pools_arg,
        default=None,
        metavar="P:D",
        help="with --simulate: P prefill replicas (running each policy) and D decode replicas",
    )
    p.add_argument(
        "--link",
        default="nvlink",
        choices=list(LINK_NAMES),
        help="with --disaggregate: how the KV goes from prefill to decode",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
