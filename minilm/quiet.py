"""Known start-up warnings of the libraries the lab imports, dropped where they are logged.

On a CPU-only torch, importing torchao (quantization.py imports it; `transformers` does when a
model class is imported) logs one line per CUDA extension that cannot load, and torch logs one
per Enum that torchao registers the deprecated way. Both are harmless here, and output is for
people. Each is dropped by its logger and its wording, so any other warning still shows: no
blanket filter.
"""

from __future__ import annotations

import logging

# logger name -> the parts a known message holds, every one of them
KNOWN = {
    "torchao": ("Failed to load ", "torchao/_C"),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
}


def not_known(record: logging.LogRecord) -> bool:
    """False for a known start-up warning (KNOWN): the logging filter that drops it."""
    parts = KNOWN.get(record.name)
    return not (parts and all(p in record.getMessage() for p in parts))


def quiet_torchao() -> None:
    """Drop torchao's known start-up warnings; call it before torchao or transformers is imported."""
    for name in KNOWN:
        logger = logging.getLogger(name)
        if not_known not in logger.filters:
            logger.addFilter(not_known)
