"""Online serving (python -m testbed.serve): an HTTP frontend, tokenizer and detokenizer
worker processes, and the engine's step loop fed by their messages instead of a trace.

    HTTP client -> app (FastAPI) -> tokenizer worker(s) -> scheduler + engine (the step loop)
                -> detokenizer worker -> app -> streamed reply

Messages (messages.py) go over ZeroMQ sockets (channels.py), each carrying the request id
the app gave the request. The launcher starts and watches the processes."""
