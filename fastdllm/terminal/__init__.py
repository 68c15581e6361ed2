"""What a person sees in a terminal: the live view of a run and its stats (view.py), the chat
REPL's session and commands (chat.py). The CLI wires them to stdin, stdout and stderr."""
