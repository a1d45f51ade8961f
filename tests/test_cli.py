"""The command line, end to end, on the tiny model."""

import json
import subprocess
import sys

import pytest

from minilm.cli import main


def test_compare_json(capsys):
    assert (
        main(
            [
                "compare",
                "--workload",
                "uniform",
                "--num-requests",
                "6",
                "--ignore-eos",
                "--json",
                "--max-num-seqs",
                "4",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["policy"] for r in rows] == ["static", "continuous", "chunked"]
    keys = {
        "policy",
        "requests",
        "output_tokens",
        "wall_s",
        "output_tok_per_s",
        "ttft_p50",
        "ttft_p99",
        "itl_p50",
        "itl_p99",
        "padding_fraction",
        "preemptions",
    }
    for r in rows:
        assert keys <= set(r) and r["requests"] == 6
    assert rows[0]["output_tokens"] == rows[1]["output_tokens"] == rows[2]["output_tokens"]
    assert rows[0]["padding_fraction"] > 0 == rows[1]["padding_fraction"]


def test_run_replays_a_json_trace_and_writes_timeline(tmp_path, capsys):
    trace = [
        {"id": "a", "prompt": "hello", "max_tokens": 3},
        {"id": "b", "prompt_ids": [5, 6], "max_tokens": 2, "arrival": 0.01},
    ]
    (tmp_path / "w.json").write_text(json.dumps(trace))
    assert (
        main(
            [
                "run",
                "--workload",
                str(tmp_path / "w.json"),
                "--ignore-eos",
                "--timeline",
                str(tmp_path / "t.json"),
                "--trace",
                str(tmp_path / "trace.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[a]" in out and "[b]" in out
    tl = json.loads((tmp_path / "t.json").read_text())
    assert sorted(r["request_id"] for r in tl["requests"]) == ["a", "b"]
    assert "traceEvents" in json.loads((tmp_path / "trace.json").read_text())


def test_bad_values_exit_cleanly(capsys):
    assert main(["compare", "--policies", "static,fifo", "--num-requests", "2"]) == 2
    assert "policy='fifo'" in capsys.readouterr().err
    assert main(["run", "--block-size", "0"]) == 2


@pytest.mark.parametrize("args", [["compare", "--help"]])
def test_module_entry_point(args):
    out = subprocess.run(
        [sys.executable, "-m", "minilm", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "--max-num-batched-tokens" in out.stdout


def test_the_readmes_long_prompt_command_shows_the_stall_removed(capsys):
    """`compare --workload long-prompt` with default knobs (the preset's recommended ones)
    must teach lesson 6: chunking shrinks the decodes' worst gaps. On the calibrated CPU
    cost model (simulated), so the test does not depend on this machine's load."""
    assert (
        main(
            [
                "compare",
                "--workload",
                "long-prompt",
                "--policies",
                "continuous,chunked",
                "--json",
                "--simulate",
                "--model",
                "tiny",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    continuous, chunked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert chunked["max_num_batched_tokens"] == 128 and continuous["max_num_batched_tokens"] == 2048
    for key in ("itl_max", "itl_worst_p99", "itl_p99"):
        assert chunked[key] < continuous[key] / 2, key
