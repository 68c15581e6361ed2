"""Training the built-in tiny LLaDA-format code model (scripts/train_tiny.py is the entry point)."""
