"""Serving: an OpenAI-compatible HTTP server over one engine (server.py, engine_thread.py,
openai_api.py, metrics.py), a client that loads any such server (bench_serve.py), its
result files (bench_result.py), and a server in a child process (process.py). Lesson 9."""
