"""`fastdllm eval`: lm-evaluation-harness tasks x profiles (tasks.py) through fastdllm's lm-eval
model class (harness.py, with LLaDA's Monte Carlo likelihood in likelihood.py), rendered by format.py."""
