"""Decoding: the block loop (engine.py) and everything it owns: the canvas plan, cache modes,
commit rules and their selection, settings (config, profiles, family defaults), events, CUDA
graphs, infilling templates. It drives a model through `models/`; nothing here reads files of a
checkpoint (checkpoints/ hands it a Decoder)."""
