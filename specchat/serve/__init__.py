"""`specchat serve`: the chat's exact engine behind an OpenAI-compatible HTTP server (protocol.py: the requests and
responses; service.py: one reply at a time on the engine, a bounded queue; app.py: the routes; cli.py: the command)."""
