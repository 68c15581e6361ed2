"""Checkpoints as published: loading (config, tensors, tokenizer, special tokens, placement),
inspection (`fastdllm info`), locating a model directory, and the tiny writers that build small
checkpoints in the exact published formats for tests, benchmarks and the built-in model. Hands
decode/ a Decoder; models/ holds the modules the weights go into."""
