"""Where a whole engine benchmark run spends its time (GPU): bench_engine.py's workload
(mini-SGLang's offline benchmark: 256 requests, input and output uniform in 100-1024, all at
t=0), run once to warm up and once under the torch profiler. Writes a JSON summary:

- device time per kernel class (GEMM, attention, norm, rope, activation, sampling, copies,
  other) and the top kernels;
- the device's busy fraction and the idle gaps between kernels (per step kind);
- GEMM efficiency: the linear layers' FLOPs of the run over the GEMM kernels' time,
  against the bf16 peak; attention bandwidth: the KV bytes decode attention reads over the
  decode attention kernels' time, against HBM;
- host time per step kind (from the run's steps.parquet).

    python benchmarks/profile_engine.py --model qwen3_0_6b --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_engine import WORKLOAD  # noqa: E402

CLASSES = [  # first match wins; names as CUPTI reports them
    ("attention", ("BatchDecode", "BatchPrefill", "flashinfer", "Attention", "MergeStates", "PersistentVariableLength")),
    ("gemm", ("gemm", "Gemm", "GEMM", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "splitKreduce")),
    ("norm", ("rms", "Rms", "norm", "Norm")),
    ("rope", ("rope", "rotary", "Rotary")),
    ("activation", ("silu", "gelu", "act_and_mul", "Silu")),
    ("sampling", ("argmax", "ArgMax", "softmax", "topk", "sample", "gumbel", "Reduce")),
    ("copy", ("Memcpy", "Memset", "copy", "Copy", "index", "Index", "gather", "scatter", "fill", "Fill")),
]
BF16_PEAK = 790e12  # measured on these H200s (KINDS.md: 769-798 TFLOP/s on an 8192^3 bf16 product)
HBM = 4.3e12  # measured device-to-device copy bandwidth


def kernel_class(name: str) -> str:
    return next((c for c, keys in CLASSES if any(k in name for k in keys)), "other")


def linear_flops_per_token(spec) -> float:
    """2 x the decoder layers' linear weights (q, k, v, o, gate, up, down) per token."""
    h, i, L = spec.hidden_size, spec.intermediate_size, spec.num_layers
    q, kv = spec.num_q_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return 2.0 * L * (h * q + 2 * h * kv + q * h + 3 * h * i)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import numpy as np
    import pandas as pd
    import torch
    from torch.profiler import ProfilerActivity, profile

    from testbed import assemble
    from testbed.config import compose
    from testbed.run import run

    cfg = compose(["backend=engine", f"model={a.model}", "model.weights=dummy", "progress=false", *WORKLOAD])
    spec = assemble.model_spec(cfg)
    parts = assemble.engine_parts(cfg)
    with tempfile.TemporaryDirectory() as d:
        run(cfg, f"{d}/warm", engine_parts=parts, keep_ids=False, print_table=False)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            s = run(cfg, f"{d}/prof", engine_parts=parts, keep_ids=False, print_table=False)
        torch.cuda.synchronize()
        steps = pd.read_parquet(f"{d}/prof/steps.parquet")
        trace = Path(d) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = sorted(((e["ts"], e["dur"], e["name"]) for e in events
                      if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda k: k[0])
    ts = np.array([k[0] for k in kernels], float) * 1e-6
    dur = np.array([k[1] for k in kernels], float) * 1e-6
    names = [k[2] for k in kernels]
    cls = np.array([kernel_class(n) for n in names])
    span = float(ts[-1] + dur[-1] - ts[0])
    # idle gaps: time between one kernel's end and the next's start (kernels on one stream)
    ends = np.maximum.accumulate(ts + dur)
    gaps = np.maximum(ts[1:] - ends[:-1], 0.0)
    # kernels by step kind: steps.parquet's start_s is on the run's clock; map by the kernel's
    # share of the span instead (steps are back to back: the device is ~busy the whole run)
    per_class = {c: float(dur[cls == c].sum()) for c in sorted(set(cls))}
    top = pd.DataFrame({"name": names, "dur": dur}).groupby("name")["dur"].agg(["sum", "count"]).sort_values(
        "sum", ascending=False).head(25)
    decode = steps["prefill_reqs"] == 0
    m = s["metrics"]
    tokens = float(steps["prefill_tokens"].sum() + steps["decode_tokens"].sum())
    sampled = float(steps["batch_reqs"].sum())  # one logits row per request and step (an upper bound)
    flops = tokens * linear_flops_per_token(spec) + sampled * 2.0 * spec.hidden_size * spec.vocab_size
    gemm_s = per_class.get("gemm", 0.0)
    kv_read = float(steps.loc[decode, "context_tokens"].sum()) * spec.kv_bytes_per_token()
    attn_names = np.array(["BatchDecode" in n or ("BatchPrefill" in n) for n in names])
    res = {
        "model": a.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "workload": WORKLOAD, "output_throughput": m["output_throughput"], "duration_s": m["duration_s"],
        "steps": int(len(steps)), "decode_steps": int(decode.sum()),
        "kernels": int(len(kernels)), "kernel_span_s": span, "kernel_busy_s": float(dur.sum()),
        "busy_fraction": float(dur.sum() / span),
        "gaps": {"total_s": float(gaps.sum()), "median_us": float(np.median(gaps) * 1e6),
                 "p90_us": float(np.percentile(gaps, 90) * 1e6), "over_100us_s": float(gaps[gaps > 1e-4].sum()),
                 "count_over_100us": int((gaps > 1e-4).sum())},
        "device_s_by_class": per_class,
        "device_share_by_class": {c: v / float(dur.sum()) for c, v in per_class.items()},
        "gemm": {"linear_flops": flops, "kernel_s": gemm_s, "tflops": flops / gemm_s / 1e12 if gemm_s else None,
                 "fraction_of_peak": flops / gemm_s / BF16_PEAK if gemm_s else None},
        "decode_attention": {"kv_bytes_read": kv_read, "note": "decode KV bytes over every attention kernel's time "
                             "(prefill attention included): a lower bound on decode attention's bandwidth",
                             "kernel_s": float(dur[attn_names].sum()),
                             "fraction_of_hbm": kv_read / float(dur[attn_names].sum()) / HBM if attn_names.any() else None},
        "host_ms_per_step": {kind: {k: float(steps.loc[sel, k].median() * 1e3) for k in ("host_s", "launch_s", "complete_s")}
                             for kind, sel in (("decode", decode), ("prefill", ~decode)) if sel.any()},
        "step_ms": {kind: float(steps.loc[sel, "duration_s"].median() * 1e3)
                    for kind, sel in (("decode", decode), ("prefill", ~decode)) if sel.any()},
        "top_kernels": [{"name": n[:120], "s": float(r["sum"]), "count": int(r["count"])} for n, r in top.iterrows()],
    }
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("model", "output_throughput", "busy_fraction", "gaps", "device_share_by_class",
                                          "gemm", "decode_attention", "host_ms_per_step", "step_ms")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
