"""The names of the engine's choices, importable without torch: the config schema checks
them at start (testbed/config.py) and the engine's modules check what they are handed."""

KERNELS = ("auto", "torch", "triton")  # engine.kernels (testbed/engine/kernels)
PREFILL_BACKENDS = ("fa2", "fa3")  # engine.prefill_backend: flashinfer prefill templates (fa3: Hopper)
