"""Built-in decoding profiles (YAML), installed as the package `fastdllm.builtin_profiles`."""
