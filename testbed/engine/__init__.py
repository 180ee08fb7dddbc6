"""The GPU engine's model side: ForwardBatch (the scheduler <-> model interface), decoder
models, paged attention backends, the KV pool, weight loading and sampling. Imports torch."""

from testbed.engine.forward_batch import ForwardBatch, paged_kv_layout

__all__ = ["ForwardBatch", "paged_kv_layout"]
