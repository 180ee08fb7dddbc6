"""The GPU engine's model side: ForwardBatch (the scheduler <-> model interface, in
forward_batch.py), decoder models, paged attention backends, the KV pool, weight loading and
sampling. Its modules import torch; the package itself, `options` and the registries of its
parts (attention/, kernels/) do not, so the config schema can name and check the engine's
choices on the light install."""
