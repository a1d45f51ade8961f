"""The cyclic garbage collector paused while code makes many objects that form no cycles.

Python frees an object when its last reference goes; the cyclic GC is only for objects that
refer to each other in a loop. It runs whenever enough new container objects have piled up,
and each pass scans every young one: a simulated run makes millions (a workload's token
lists, a timeline's records), none in a cycle, so those passes were pure cost.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off inside. On the way out what was made meanwhile goes to the oldest
    generation unscanned (`freeze` then `unfreeze`), else the first collection after (in
    whatever code runs next) would scan it all at once: 0.3 s of a 10,000-request simulation.
    A cycle among those objects is still freed, by the next full collection."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:  # none frozen by the caller: unfreeze lets go of ours only
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()
