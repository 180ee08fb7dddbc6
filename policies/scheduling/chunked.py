from policies.scheduling.decode_first import DecodeFirst


class Chunked(DecodeFirst):
    """Sarathi-Serve stall-free batching: the same order as decode_first (decodes, then
    prefill chunks under way, then new prefills in chunks) under a small fixed per-step
    token budget (token_budget, default 512), so that no step stalls the decodes."""
    name = "chunked"

    def step_budget(self) -> int:
        return self.cfg.token_budget
