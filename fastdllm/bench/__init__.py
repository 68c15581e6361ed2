"""`fastdllm bench`: named configurations x sweeps over a prompt set (cases.py), measured on one
model (runner.py), rendered as tables, files and plots (format.py)."""
