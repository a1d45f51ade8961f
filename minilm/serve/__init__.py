"""Serving (lesson 9): an OpenAI-compatible HTTP server over one engine. server.py and
openai_api.py speak HTTP; engine_client.py is their handle on the engine, which runs in a
process of its own (engine_core.py) or a thread (engine_thread.py), both driving
engine_loop.py. The load client and its result files are the clients' (minilm/client/)."""
