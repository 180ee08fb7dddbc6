"""Simulator runs drawn across every knob at once (hypothesis), for the tests that must hold on
any configuration: the fast path against stepping one by one (test_fastpath.py), the run files'
invariants (test_run_invariants.py). Small traces, so stretches early in a run come up too."""
from __future__ import annotations

from hypothesis import strategies as st

A100 = ["hardware=a100", "costmodel=roofline"]  # no A100 profile: the roofline


@st.composite
def configurations(draw):
    """A run's overrides: trace, policy, order, reservation, eviction, page size, overlap, running
    cap, model, KV pool, chunk cap, and the A100 roofline or not."""
    trace = draw(st.sampled_from(["sharegpt", "azure_conv", "mooncake_conversation", "synthetic", "arxiv"]))
    policy = draw(st.sampled_from(["prefill_first", "decode_first", "chunked"]))
    ov = [f"trace={trace}", f"policy={policy}", f"trace.num_requests={draw(st.sampled_from([40, 80]))}",
          f"policy.order={draw(st.sampled_from(['fcfs', 'sjf', 'lpm', 'priority']))}",
          f"policy.reserve={draw(st.sampled_from(['full', 'estimate']))}",
          f"eviction={draw(st.sampled_from(['lru', 'fifo', 'lfu', 'slru', 'priority']))}",
          f"engine.page_size={draw(st.sampled_from([1, 4, 16]))}",
          f"engine.overlap={draw(st.sampled_from(['true', 'false']))}",
          f"scheduler.max_running={draw(st.sampled_from([4, 16, 64, 256]))}",
          f"model={draw(st.sampled_from(['llama3_8b', 'qwen3_0_6b']))}",
          f"engine.num_pages={draw(st.sampled_from([2500, 8000, 60000]))}",
          f"policy.chunk_size={draw(st.sampled_from([0, 64]))}"]
    if draw(st.booleans()):
        ov += A100
    if trace == "synthetic":
        ov += ["trace.num_prefix_groups=4", "trace.prefix_len=96"]
    if trace in ("azure_conv", "mooncake_conversation"):
        ov.append("trace.time_scale=0.1")
    return ov
