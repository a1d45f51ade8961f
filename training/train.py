"""Train the lab's small model on the standard library's docstrings.

    python -m training.train --out minilm/checkpoints/docstrings --time-budget-min 50
    python -m training.train --smoke            # a few steps on a slice of the corpus (CI)
    python -m training.train --device cuda ...  # the same script on a GPU
    python -m training.train --out minilm/checkpoints/docstrings-draft --tokenizer \
        minilm/checkpoints/docstrings/tokenizer.json ...  # a draft model for speculative decoding

No model can be downloaded on an offline laptop, so the lab trains its own from
text every Python installation carries: the docstrings of the standard library.
The steps, one function each:

1. corpus     import the stdlib's modules, read `__doc__` of modules, classes and
              functions, clean and deduplicate them: one document per docstring
2. split      a deterministic held-out split (by a hash of each document's text)
3. tokenizer  byte-level BPE trained with `tokenizers`: any text encodes (or, with
              --tokenizer, an existing one: a draft model shares its target's ids)
4. rows       token rows that start at a document's first token, as an engine
              prompt does (no BOS: the engine encodes prompts without one), and
              run on into the next documents after their EOS
5. train      AdamW, linear warmup then cosine decay, gradient clipping; the
              model's dense causal path (training/dense.py)
6. save       the HF-format checkpoint with the best held-out loss, a model card
              (README.md) with its numbers and samples written by the engine
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import json
import math
import os
import pkgutil
import platform
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from minilm.config import ModelConfig
from minilm.model.llama import LlamaModel
from minilm.model.loader import load_model

from .checkpoint import save_checkpoint
from .dense import dense_logits

# ---- 1. corpus ----------------------------------------------------------------------

# Modules that do something when imported (print, open a browser or a window), need a
# display, or are test suites and generated data rather than documentation.
SKIP_MODULES = {
    "this",
    "antigravity",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "test",
    "pydoc_data",
    "lib2to3",
    "ensurepip",
}
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]
MIN_DOC_CHARS = 10


def is_skipped(module_name: str) -> bool:
    parts = module_name.split(".")
    return (
        parts[0] in SKIP_MODULES
        or any(p.startswith(("__", "_test", "_xx", "xx")) for p in parts)  # __main__ runs code
        or any(p in ("test", "tests", "idle_test") for p in parts)
    )


def import_quietly(name: str):
    """The module, or None when it cannot be imported here (Windows-only modules, ...)."""
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - a module may raise anything, even SystemExit
        return None


def stdlib_modules(limit: int | None = None) -> list:
    """The importable standard-library modules and their submodules, in name order."""
    modules = {}
    for top in sorted(sys.stdlib_module_names):
        if is_skipped(top) or (limit is not None and len(modules) >= limit):
            continue
        module = import_quietly(top)
        if module is None:
            continue
        modules[top] = module
        for info in pkgutil.walk_packages(
            getattr(module, "__path__", []), top + ".", onerror=lambda _: None
        ):
            sub = None if is_skipped(info.name) else import_quietly(info.name)
            if sub is not None:
                modules[info.name] = sub
    return [modules[k] for k in sorted(modules)]


def raw_docstrings(module) -> list:
    """`__doc__` of the module, its classes and functions, and the classes' methods."""
    docs = [module.__doc__]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_"):
            continue
        if inspect.isclass(obj):
            docs.append(obj.__doc__)
            docs.extend(
                getattr(member, "__doc__", None)
                for key, member in sorted(vars(obj).items())
                if (not key.startswith("_") or key == "__init__")
                and (callable(member) or isinstance(member, (property, staticmethod, classmethod)))
            )
        elif callable(obj):
            docs.append(obj.__doc__)
    return docs


def gather_docstrings(limit_modules: int | None = None) -> list[str]:
    """Cleaned, deduplicated docstrings in a deterministic order (for one Python version)."""
    seen, docs = set(), []
    for module in stdlib_modules(limit_modules):
        with warnings.catch_warnings():  # reading some attributes warns (typing.io is deprecated)
            warnings.simplefilter("ignore")
            module_docs = raw_docstrings(module)
        for doc in module_docs:
            if not isinstance(doc, str):
                continue
            doc = inspect.cleandoc(doc).strip()
            if len(doc) >= MIN_DOC_CHARS and doc not in seen:
                seen.add(doc)
                docs.append(doc)
    return docs


# ---- 2. split -----------------------------------------------------------------------


def is_heldout(doc: str, percent: int) -> bool:
    """By a hash of the text, so a document is on the same side on every machine and run."""
    return int(hashlib.sha1(doc.encode("utf-8")).hexdigest(), 16) % 100 < percent


def split_docs(docs: list[str], heldout_percent: int) -> tuple[list[str], list[str]]:
    if not 0 < heldout_percent < 100:
        raise ValueError(f"heldout_percent={heldout_percent}; allowed: 1..99")
    train = [d for d in docs if not is_heldout(d, heldout_percent)]
    heldout = [d for d in docs if is_heldout(d, heldout_percent)]
    return train, heldout


# ---- 3. tokenizer -------------------------------------------------------------------


def train_tokenizer(docs: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style): the 256 bytes are in the vocabulary, so nothing is unknown."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def get_tokenizer(args, train_docs: list[str]):
    """`--tokenizer`'s file when given: a draft model for speculative decoding must map text
    to exactly its target's token ids, which a BPE retrained at another size would not."""
    if args.tokenizer is None:
        return train_tokenizer(train_docs, args.vocab_size)
    from tokenizers import Tokenizer

    return Tokenizer.from_file(args.tokenizer)


def save_tokenizer(args, tok, out: Path) -> None:
    """A given tokenizer is copied byte for byte, so the draft's file is the target's."""
    if args.tokenizer is None:
        tok.save(str(out / "tokenizer.json"))
    elif Path(args.tokenizer).resolve() != (out / "tokenizer.json").resolve():
        shutil.copyfile(args.tokenizer, out / "tokenizer.json")


def token_byte_lengths(tok) -> torch.Tensor:
    """UTF-8 bytes each token stands for (0 for special tokens): the denominator of bits per byte.
    In a byte-level vocabulary every character of a token's string is one byte."""
    lengths = torch.zeros(tok.get_vocab_size(), dtype=torch.float64)
    for token, i in tok.get_vocab().items():
        lengths[i] = 0 if token in SPECIAL_TOKENS else len(token)
    return lengths


def encode_docs(tok, docs: list[str]) -> list[list[int]]:
    """Each document's tokens followed by EOS: the model learns where a docstring ends."""
    eos = tok.token_to_id("<eos>")
    return [enc.ids + [eos] for enc in tok.encode_batch(docs, add_special_tokens=False)]


# ---- 4. rows ------------------------------------------------------------------------


@dataclass
class TokenRows:
    """A token stream and where rows of `seq_len + 1` tokens start (input + shifted target)."""

    stream: torch.Tensor  # [N] int64, the documents one after another
    starts: torch.Tensor  # [R] int64

    def batch(self, index: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.stream[s : s + seq_len + 1] for s in self.starts[index].tolist()])
        return rows[:, :-1], rows[:, 1:]


def train_rows(encoded: list[list[int]], seq_len: int) -> TokenRows:
    """A row at every document start (and every `seq_len` tokens into a long document), so
    the model learns to begin a docstring at position 0, as it must for an engine prompt."""
    stream = torch.tensor([t for doc in encoded for t in doc], dtype=torch.long)
    starts, offset = [], 0
    for doc in encoded:
        starts.extend(range(offset, offset + len(doc) - 1, seq_len))
        offset += len(doc)
    last = len(stream) - seq_len - 1  # a row must fit in the stream
    starts = [min(s, last) for s in starts]
    return TokenRows(stream, torch.tensor(starts, dtype=torch.long))


def eval_rows(encoded: list[list[int]], seq_len: int) -> TokenRows:
    """Back-to-back rows: every token after the first is predicted exactly once, so the
    summed loss over bytes is the held-out set's bits per byte."""
    stream = torch.tensor([t for doc in encoded for t in doc], dtype=torch.long)
    if len(stream) < seq_len + 2:
        raise ValueError(
            f"held-out split has {len(stream)} tokens, fewer than one row of seq_len={seq_len}; "
            f"raise --heldout-percent or --limit-modules, or lower --seq-len"
        )
    return TokenRows(stream, torch.arange(0, len(stream) - seq_len - 1, seq_len, dtype=torch.long))


# ---- 5. train -----------------------------------------------------------------------


@dataclass
class EvalResult:
    loss: float  # nats per token
    bits_per_byte: float
    tokens: int


@torch.no_grad()
def evaluate(
    model: LlamaModel,
    rows: TokenRows,
    seq_len: int,
    byte_lengths: torch.Tensor,
    device: str,
    max_rows: int | None = None,
    batch_size: int = 16,
) -> EvalResult:
    model.eval()
    n = len(rows.starts) if max_rows is None else min(max_rows, len(rows.starts))
    nats, tokens, nbytes = 0.0, 0, 0.0
    for i in range(0, n, batch_size):
        x, y = rows.batch(torch.arange(i, min(i + batch_size, n)), seq_len)
        logits = dense_logits(model, x.to(device))
        nats += F.cross_entropy(
            logits.flatten(0, 1), y.to(device).flatten(), reduction="sum"
        ).item()
        tokens += y.numel()
        nbytes += byte_lengths[y].sum().item()
    model.train()
    return EvalResult(nats / tokens, nats / math.log(2) / nbytes, tokens)


def lr_at(step: int, total_steps: int, warmup: int, peak: float, floor: float = 0.1) -> float:
    """Linear warmup to `peak`, then cosine decay to `floor * peak` at `total_steps`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_model(args, tok) -> LlamaModel:
    cfg = ModelConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=args.seq_len,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id("<bos>"),
        eos_token_id=tok.token_to_id("<eos>"),
    )
    return LlamaModel(cfg).init_random(args.seed)


def plan_steps(args, step_seconds: float, elapsed: float, done: int) -> int:
    """Total steps: `--steps`, fewer if they would not fit in the time budget at the measured
    speed (90% of it: evaluations and a busy machine take their share)."""
    if args.time_budget_min is None:
        return args.steps
    left = args.time_budget_min * 60 - elapsed
    return min(args.steps, done + max(1, int(0.9 * left / step_seconds)))


def train(args) -> dict:
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    docs = gather_docstrings(args.limit_modules)
    train_docs, heldout_docs = split_docs(docs, args.heldout_percent)
    tok = get_tokenizer(args, train_docs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(args, tok, out)
    (out / "heldout.json").write_text(json.dumps(heldout_docs, indent=0))
    train_ids, heldout_ids = encode_docs(tok, train_docs), encode_docs(tok, heldout_docs)
    rows, held = train_rows(train_ids, args.seq_len), eval_rows(heldout_ids, args.seq_len)
    byte_lengths = token_byte_lengths(tok)
    num_train_tokens = sum(map(len, train_ids))
    print(
        f"corpus: {len(docs)} docstrings ({sum(map(len, docs)) / 1e6:.2f} M chars) from Python "
        f"{platform.python_version()}; train {len(train_docs)} docs / {num_train_tokens} tokens, "
        f"held-out {len(heldout_docs)} docs / {held.stream.numel()} tokens; vocab {tok.get_vocab_size()} "
        f"[{time.time() - t0:.1f}s]",
        flush=True,
    )

    model = build_model(args, tok).to(args.device).train()
    print(
        f"model: {model.config.num_params / 1e6:.2f} M parameters, {args.num_layers} layers, "
        f"hidden {args.hidden_size}, context {args.seq_len}",
        flush=True,
    )
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(rows.starts), generator=gen)
    total_steps, cursor, best, history = args.steps, 0, None, []
    t_train = time.time()
    step = 0
    while step < total_steps:
        if cursor + args.batch_size > len(order):  # a new epoch, a new shuffle
            order, cursor = torch.randperm(len(rows.starts), generator=gen), 0
        x, y = rows.batch(order[cursor : cursor + args.batch_size], args.seq_len)
        cursor += args.batch_size
        lr = lr_at(step, total_steps, args.warmup, args.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        logits = dense_logits(model, x.to(args.device))
        loss = F.cross_entropy(logits.flatten(0, 1), y.to(args.device).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        if step == args.measure_steps and args.time_budget_min is not None:
            total_steps = plan_steps(args, (time.time() - t_train) / step, time.time() - t0, step)
            print(
                f"measured {(time.time() - t_train) / step:.2f} s/step: planning {total_steps} steps",
                flush=True,
            )
        if step % args.eval_every == 0 or step == total_steps:
            ev = evaluate(model, held, args.seq_len, byte_lengths, args.device, args.eval_rows)
            elapsed = time.time() - t_train
            history.append(
                {
                    "step": step,
                    "train_loss": loss.item(),
                    "heldout_loss": ev.loss,
                    "bits_per_byte": ev.bits_per_byte,
                    "seconds": elapsed,
                }
            )
            print(
                f"step {step}/{total_steps}  lr {lr:.2e}  train loss {loss.item():.3f}  held-out loss "
                f"{ev.loss:.3f}  bpb {ev.bits_per_byte:.3f}  tokens {step * args.batch_size * args.seq_len}  "
                f"[{elapsed / 60:.1f} min]",
                flush=True,
            )
            if best is None or ev.loss < best["heldout_loss"]:
                best = history[-1]
                save_checkpoint(model, out, dtype=args.dtype)
        if args.time_budget_min is not None and time.time() - t0 > args.time_budget_min * 60:
            print(f"time budget of {args.time_budget_min} min reached at step {step}", flush=True)
            break
    args.planned_steps = total_steps
    stats = finish(
        args,
        out,
        tok,
        held,
        byte_lengths,
        best,
        history,
        step,
        num_train_tokens,
        len(docs),
        len(train_docs),
        len(heldout_docs),
        time.time() - t_train,
    )
    return stats


# ---- 6. save ------------------------------------------------------------------------


def sample_completions(
    out: Path, heldout_docs: list[str], n: int, max_tokens: int
) -> list[tuple[str, str, str]]:
    """(prompt, completion, finish reason) from the engine, greedy, on held-out beginnings."""
    from minilm import Engine
    from minilm.workload import docstring_prompt

    engine = Engine(str(out), max_num_seqs=8)  # max_model_len: the context it was trained on
    prompts = [docstring_prompt(d) for d in heldout_docs[:n]]
    for i, p in enumerate(prompts):
        room = engine.config.max_model_len - len(engine.tokenizer.encode(p))
        engine.add_request(f"s{i}", prompt=p, max_tokens=min(max_tokens, room))
    engine.run()
    return [
        (p, engine.text(f"s{i}"), engine.requests[f"s{i}"].finish_reason)
        for i, p in enumerate(prompts)
    ]


def finish(
    args,
    out: Path,
    tok,
    held: TokenRows,
    byte_lengths,
    best,
    history,
    steps,
    num_train_tokens,
    num_docs,
    num_train_docs,
    num_heldout_docs,
    train_seconds,
) -> dict:
    """Re-measure the saved (float16) checkpoint on the whole held-out split; write the model card."""
    from tokenizers import Tokenizer

    save_tokenizer(args, tok, out)  # save_checkpoint writes weights and config only
    shipped = load_model(str(out), device=args.device)
    ev = evaluate(shipped, held, args.seq_len, byte_lengths, args.device)
    heldout_docs = json.loads((out / "heldout.json").read_text())
    samples = sample_completions(out, heldout_docs, args.num_samples, args.sample_tokens)
    stats = {
        "heldout_loss": ev.loss,
        "bits_per_byte": ev.bits_per_byte,
        "heldout_tokens": ev.tokens,
        "best_step": best["step"],
        "steps": steps,
        "planned_steps": args.planned_steps,
        "tokens_seen": best["step"] * args.batch_size * args.seq_len,
        "train_tokens": num_train_tokens,
        "train_seconds": train_seconds,
        "num_params": shipped.config.num_params,
        "docs": num_docs,
        "train_docs": num_train_docs,
        "heldout_docs": num_heldout_docs,
    }
    (out / "train_log.json").write_text(
        json.dumps({"args": vars(args), "stats": stats, "history": history}, indent=1)
    )
    write_model_card(
        args, out, stats, samples, Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
    )
    print(
        f"saved {out}: held-out loss {ev.loss:.3f} nats/token, {ev.bits_per_byte:.3f} bits/byte "
        f"(best step {best['step']} of {steps})",
        flush=True,
    )
    for prompt, completion, reason in samples:
        print(f"  {prompt!r} -> {completion!r} [{reason}]")
    return stats


def reproduce_command(args, steps: int) -> str:
    """The run's flags with the steps it planned, not its time budget: the same command
    then trains the same model on any machine (with the same Python, for the same corpus)."""
    defaults = vars(build_parser().parse_args([]))
    flags = [f"--out {args.out}", f"--steps {steps}"]
    flags += [
        f"--{k.replace('_', '-')} {getattr(args, k)}"
        for k, v in defaults.items()
        if k not in ("out", "steps", "smoke", "time_budget_min", "measure_steps")
        and getattr(args, k) != v
    ]
    return "python -m training.train " + " ".join(flags)


def machine_name(device: str, threads: int | None) -> str:
    if device != "cpu":
        return torch.cuda.get_device_name()
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [
            ln.split(":", 1)[1].strip()
            for ln in cpuinfo.read_text().splitlines()
            if ln.startswith("model name")
        ]
        if cpuinfo.exists()
        else []
    )
    return (
        f"{names[0] if names else platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch threads {threads or torch.get_num_threads()}"
    )


def write_model_card(args, out: Path, s: dict, samples, vocab_size: int) -> None:
    machine = machine_name(args.device, args.threads)
    lines = [
        f"# {out.name}: a small Llama-family model trained on the Python standard library's docstrings",
        "",
        "Trained by `training/train.py` so the lab writes real text offline (no model can be downloaded).",
        "Every number here was written by the training script.",
        "",
        "| | |",
        "|---|---|",
        f"| corpus | {s['docs']} deduplicated docstrings of Python {platform.python_version()}'s standard library "
        f"(modules, classes, functions, methods), one document each, ending with `<eos>` |",
        f"| split | {s['train_docs']} train / {s['heldout_docs']} held-out documents "
        f"(sha1 of the text mod 100 < {args.heldout_percent}; the held-out texts are in `heldout.json`) |",
        f"| tokenizer | byte-level BPE, {vocab_size} tokens (`tokenizer.json`), specials {', '.join(SPECIAL_TOKENS)}"
        + (f"; a copy of `{args.tokenizer}` (the same token ids)" if args.tokenizer else "")
        + " |",
        f"| model | Llama (SwiGLU, RMSNorm, RoPE, GQA), {s['num_params'] / 1e6:.2f} M parameters: "
        f"{args.num_layers} layers, hidden {args.hidden_size}, MLP {args.intermediate_size}, "
        f"{args.num_heads} heads / {args.num_kv_heads} KV heads, tied embeddings, context {args.seq_len}, "
        f"weights in {args.dtype} |",
        f"| training | AdamW (peak lr {args.lr}, weight decay {args.weight_decay}), warmup {args.warmup} steps then "
        f"cosine, clip {args.grad_clip}; batch {args.batch_size} x {args.seq_len} tokens; {s['steps']} steps, "
        f"shipped weights from step {s['best_step']} (best held-out loss) |",
        f"| tokens seen | {s['tokens_seen']:,} ({s['tokens_seen'] / s['train_tokens']:.1f} epochs of "
        f"{s['train_tokens']:,} train tokens) |",
        f"| held-out loss | {s['heldout_loss']:.3f} nats/token over {s['heldout_tokens']:,} tokens "
        f"(random weights: ln {vocab_size} = {math.log(vocab_size):.2f}) |",
        f"| bits per byte | {s['bits_per_byte']:.3f} |",
        f"| training time | {s['train_seconds'] / 60:.1f} min on {machine} |",
        "",
        "Reproduce (the corpus depends on the Python version, so numbers move a little on another one):",
        "",
        "```",
        reproduce_command(args, s["planned_steps"]),
        "```",
        "",
        f"Use it: `python -m minilm run --model {out.name} --workload docstrings`, or "
        f'`Engine("{out.name}", ...)` / `load_model("{out.name}")`.',
        "",
        f"## Samples (the engine, greedy, prompts are beginnings of held-out docstrings, max_tokens {args.sample_tokens})",
        "",
    ]
    for prompt, completion, reason in samples:
        lines += [
            f"- prompt `{prompt!r}` ({reason})",
            "",
            "  ```",
            *("  " + ln for ln in (prompt + completion).splitlines()),
            "  ```",
            "",
        ]
    (out / "README.md").write_text("\n".join(lines))


# ---- command line -------------------------------------------------------------------

SMOKE = dict(
    limit_modules=12,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    seq_len=64,
    batch_size=8,
    steps=6,
    warmup=2,
    eval_every=3,
    eval_rows=8,
    num_samples=2,
    sample_tokens=8,
    time_budget_min=None,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", default=None, help="checkpoint directory (default: a temp dir with --smoke)"
    )
    p.add_argument(
        "--smoke", action="store_true", help="a handful of steps on a small corpus slice (CI)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--limit-modules", type=int, default=None, help="only the first N top-level modules"
    )
    p.add_argument("--heldout-percent", type=int, default=5)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument(
        "--tokenizer",
        default=None,
        help="use this tokenizer.json instead of training one (a draft shares its target's ids)",
    )
    p.add_argument("--hidden-size", type=int, default=192)
    p.add_argument("--intermediate-size", type=int, default=512)
    p.add_argument("--num-layers", type=int, default=6)
    p.add_argument("--num-heads", type=int, default=6)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--steps", type=int, default=2000, help="total steps (the cosine schedule's length)"
    )
    p.add_argument(
        "--time-budget-min",
        type=float,
        default=None,
        help="fewer steps if --steps would not fit in this many minutes at the speed of the "
        "first --measure-steps",
    )
    p.add_argument("--measure-steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument(
        "--eval-rows",
        type=int,
        default=48,
        help="held-out rows per periodic evaluation (all at the end)",
    )
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--num-samples", type=int, default=6)
    p.add_argument("--sample-tokens", type=int, default=96)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
        args.out = args.out or tempfile.mkdtemp(prefix="minilm-smoke-")
    if args.out is None:
        p.error("--out is required (except with --smoke)")
    return args


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
