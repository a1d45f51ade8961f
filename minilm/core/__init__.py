"""The engine core: the loop, the scheduler and its policies, the KV cache's books, the
clocks; it runs `minilm.model`'s model or the simulator (`minilm.sim`)."""
