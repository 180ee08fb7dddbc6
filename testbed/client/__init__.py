"""backend=http: a client that replays a trace against an OpenAI-compatible server (ours,
SGLang, vLLM) at the trace's arrival times, streamed, and records each request's timeline
as the client sees it (the same requests.parquet schema as the other backends)."""
from testbed.client.driver import HttpDriver
from testbed.client.record import ClientRecord, client_row

__all__ = ["HttpDriver", "ClientRecord", "client_row"]
