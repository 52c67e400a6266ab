"""The server's bounds that its command line can change (serve/arguments.py) and its service keeps (service.py)."""

MAX_WAITING = 8  # requests admitted at once (one runs, the rest wait); more are answered 429
MAX_TOKENS = 2048  # a reply whose request names no max_tokens ends here at the latest (--max-tokens)
