"""`python -m fastdllm ...`: the `fastdllm` command, as the launchers run it
(`torchrun --nproc-per-node N -m fastdllm eval ...`, `accelerate launch -m fastdllm eval ...`)."""

from fastdllm.cli.app import main

if __name__ == "__main__":
    main()
