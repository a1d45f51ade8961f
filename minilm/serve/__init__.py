"""Serving (lesson 9): an OpenAI-compatible HTTP server over one engine or several
(--data-parallel-size). server.py and openai_api.py speak HTTP; engine_client.py is their
handle on the engine cores (and routes requests among them), which run each in a process of
its own (engine_core.py) or, one, in a thread (engine_thread.py), all driving
engine_loop.py. The load client and its result files are the clients' (minilm/client/)."""
