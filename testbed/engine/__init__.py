"""The GPU engine's model side: ForwardBatch (the scheduler <-> model interface, in
forward_batch.py), decoder models, paged attention backends, the KV pool, weight loading and
sampling. Its modules import torch; the package itself and the registries of its parts
(attention/, kernels/) do not, so a simulator run can check engine.* names."""
