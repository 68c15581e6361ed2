"""`python -m fastdllm ...`: the `fastdllm` command, as the launchers run it
(`torchrun --nproc-per-node N -m fastdllm eval ...`, `accelerate launch -m fastdllm eval ...`).
Importing the app first is what sets the OpenMP wait policy before torch loads (cli/app.py)."""

from fastdllm.cli.app import main

if __name__ == "__main__":
    main()
