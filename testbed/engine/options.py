"""Names of the engine's choices that are no registry's (a registry lists the pluggable
ones: testbed/engine/attention, testbed/engine/kernels), importable without torch: the
config schema checks them at start and the engine's modules check what they are handed."""

PREFILL_BACKENDS = ("fa2", "fa3")  # engine.prefill_backend: flashinfer prefill templates (fa3: Hopper)
