"""`fastdllm serve`: an OpenAI-compatible HTTP server over the engine (app.py), with a scheduler
that batches concurrent requests and lets rows join and leave at block boundaries (scheduler.py)."""
