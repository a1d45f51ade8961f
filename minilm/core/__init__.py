"""The engine core: the loop, the scheduler and its batching policies, the KV cache's
books, the clocks. Plain Python over the contracts (config, request, plan, timeline);
the model it runs is `minilm.model`'s, or the simulator's (`minilm.sim`)."""
