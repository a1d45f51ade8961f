"""Tokenizers: a byte-level one for random-weight models, and HF `tokenizer.json` files,
with one small interface: `encode`, `decode`, `eos_token_id`, `bos_token_id`, `vocab_size`.
"""

from __future__ import annotations

from pathlib import Path


class ByteTokenizer:
    """Every UTF-8 byte is a token (ids 0-255); 256 is BOS and 257 is EOS."""

    bos_token_id, eos_token_id, vocab_size = 256, 257, 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # ids past the bytes (a random model's vocabulary can be larger) show as U+FFFD
        special = (self.bos_token_id, self.eos_token_id)
        ids = [i if i < 256 else 0xFF for i in ids if i not in special]
        return bytes(ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizer.json` loaded with the `tokenizers` library."""

    def __init__(self, path: str | Path, bos_token: str = "<bos>", eos_token: str = "<eos>"):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.bos_token_id = self._tok.token_to_id(bos_token)
        self.eos_token_id = self._tok.token_to_id(eos_token)
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(checkpoint_dir: str | Path | None) -> ByteTokenizer | HFTokenizer:
    """The checkpoint's `tokenizer.json` when it has one, else the byte tokenizer."""
    if checkpoint_dir is not None and (Path(checkpoint_dir) / "tokenizer.json").exists():
        return HFTokenizer(Path(checkpoint_dir) / "tokenizer.json")
    return ByteTokenizer()
