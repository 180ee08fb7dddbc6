"""Matplotlib figures over loaded runs (Agg backend: works headless and in CI).

Every function returns a Figure; `save(fig, path)` writes a PNG and closes it.

    latency_cdfs(r.requests, by="policy")                       # TTFT / TPOT / E2E CDFs
    load_curves(r.summaries, x="trace.rate", by="policy")       # latency and goodput vs load
    gantt(r.job(name).requests, steps=r.job(name).steps)        # a few requests' lifetimes, chunk by chunk
    kv_timeline(r.job(name).steps)                              # KV pages, batch mix over time
    cdf_overlay(compare.cdf_overlay({...}), "ttft")             # run vs run
"""
from __future__ import annotations

from pathlib import Path

import sys

import matplotlib

if "ipykernel" not in sys.modules:  # notebooks keep their inline backend
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import metrics as M  # noqa: E402

LABELS = {
    "median_ttft_ms": "median TTFT (ms)", "p90_ttft_ms": "p90 TTFT (ms)", "p99_ttft_ms": "p99 TTFT (ms)",
    "mean_ttft_ms": "mean TTFT (ms)", "median_tpot_ms": "median TPOT (ms)", "p99_tpot_ms": "p99 TPOT (ms)",
    "mean_tpot_ms": "mean TPOT (ms)", "p99_itl_ms": "p99 ITL (ms)", "median_e2e_latency_ms": "median E2E (ms)",
    "p99_e2e_latency_ms": "p99 E2E latency (ms)", "mean_queue_ms": "mean queueing delay (ms)",
    "p99_queue_ms": "p99 queueing delay (ms)",
    "request_throughput": "throughput (req/s)", "goodput": "goodput (req/s within SLO)",
    "slo_attainment": "SLO attainment (share of requests)", "output_throughput": "output throughput (tok/s)",
    "total_token_throughput": "token throughput (tok/s)", "prefix_cache_hit_rate": "prefix-cache hit rate",
    "mean_kv_utilization": "mean KV utilisation", "preemptions": "preemptions",
    "trace.rate": "arrival rate (req/s)", "offered_rate": "measured arrival rate (req/s)",
    "trace.time_scale": "trace time scale (x trace timestamps)", "policy.token_budget": "token budget (tokens/step)",
    "engine.num_pages": "KV pool (pages)",
}


def label_of(key: str) -> str:
    return LABELS.get(key, key)


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def _series_labels(df: pd.DataFrame, by) -> pd.Series:
    keys = [by] if isinstance(by, str) else list(by)
    if keys != ["job"]:  # the default: a single run's frame has no job column, and is one series
        M.require_columns(df, f"by={by!r}", keys)
    keys = [k for k in keys if k in df]
    if not keys:
        return pd.Series(["all"] * len(df), index=df.index)
    if len(keys) == 1:
        return df[keys[0]].map(_fmt)
    return df[keys].apply(lambda r: ", ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in r.items()), axis=1)


def _as_list(by) -> list:
    return [by] if isinstance(by, str) else list(by)


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _colors(labels) -> dict:
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def log_axis(ax, axis: str = "x") -> None:
    """Log scale with plain numbers (50, 100, 200) instead of 5x10^1 labels; minor ticks at
    2 and 5 are labelled when the data span less than two decades."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    a = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    lo, hi = (ax.get_xlim() if axis == "x" else ax.get_ylim())
    if lo > 0 and hi / lo < 100:
        a.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if round(v / 10 ** np.floor(np.log10(v))) in (2, 5)
                                            else ""))
    else:
        a.set_minor_formatter(NullFormatter())


def _legend(ax, n: int, **kw):
    if n and ax.get_legend_handles_labels()[0]:  # groups without data draw no lines
        ax.legend(fontsize=8 if n > 6 else 9, framealpha=0.85, **kw)


# ---- latency distributions -------------------------------------------------------------------
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))


def latency_cdfs(requests: pd.DataFrame, by="job", metrics=("ttft", "tpot", "e2e"), title: str | None = None,
                 log: bool = True, style: str | None = None):
    """One panel per latency, one CDF line per group (by: a column or list of columns).
    style: a second column drawn as line style (e.g. by="policy", style="trace.rate": a colour
    per policy, a dash pattern per rate)."""
    df = requests.assign(_series=_series_labels(requests, by if style is None else [*_as_list(by), style]))
    labels = list(dict.fromkeys(df["_series"]))
    if style is None:
        colors, styles = _colors(labels), {lab: "-" for lab in labels}
    else:
        first = df.groupby("_series", sort=False)[_as_list(by)].first().apply(tuple, axis=1)
        kinds = list(dict.fromkeys(first))
        cmap = _colors(kinds)
        colors = {lab: cmap[first[lab]] for lab in labels}
        levels = list(dict.fromkeys(df.groupby("_series", sort=False)[style].first()))
        lv = df.groupby("_series", sort=False)[style].first()
        styles = {lab: LINESTYLES[levels.index(lv[lab]) % len(LINESTYLES)] for lab in labels}
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for lab in labels:
            v, c = M.cdf(M.latency_values(df[df["_series"] == lab], m))
            if len(v):
                ax.step(v, c, where="post", color=colors[lab], ls=styles[lab], label=lab, lw=1.5)
        if log and ax.has_data():
            log_axis(ax, "x")
        ax.set_xlabel(M.UNITS[m])
        ax.set_ylabel("fraction of token gaps" if m == "itl" else "fraction of finished requests")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3, which="both")
    if len(labels) > 4:  # outside, right of the last panel: many lines would hide the curves
        _legend(axes[0][-1], len(labels), loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    else:
        _legend(axes[0][-1], len(labels), loc="lower right")
    fig.suptitle(title or f"latency CDFs by {by if isinstance(by, str) else ', '.join(by)}")
    fig.tight_layout()
    return fig


def cdf_overlay(overlay: pd.DataFrame, metric: str = "ttft", title: str | None = None, ax=None):
    """Plot compare.cdf_overlay's frame: one CDF per run on one axis."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
    runs = list(dict.fromkeys(overlay["run"]))
    colors = _colors(runs)
    for run in runs:
        d = overlay[overlay["run"] == run]
        ax.step(d["value_ms"], d["cdf"], where="post", label=str(run), color=colors[run], lw=1.5)
    if ax.has_data():
        log_axis(ax, "x")
    ax.set_xlabel(M.UNITS.get(metric, metric))
    ax.set_ylabel("fraction of finished requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3, which="both")
    _legend(ax, len(runs), loc="lower right")
    ax.set_title(title or f"{metric.upper()} CDF, run against run")
    return fig or ax.figure


# ---- against load ----------------------------------------------------------------------------
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def _ms(i: int, n: int) -> float:
    return max(9.0 - 5.0 * i / max(n - 1, 1), 4.0)


def load_curves(summaries: pd.DataFrame, x: str = "trace.rate", by="policy",
                metrics=("median_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "goodput"), title: str | None = None,
                logx: bool = False):
    """One panel per metric against x (default the offered rate), one line per group. goodput
    falls back to request_throughput when the runs had no SLO; latency axes are log scale."""
    if x not in summaries:
        raise ValueError(f"no column {x!r} to plot against; columns: {', '.join(map(str, summaries.columns))}")
    df = summaries.assign(_series=_series_labels(summaries, by)).sort_values(x)
    labels = list(dict.fromkeys(summaries.assign(_series=_series_labels(summaries, by))["_series"]))
    colors = _colors(labels)
    metrics = [m if m in df and df[m].notna().any() else ("request_throughput" if m == "goodput" else m)
               for m in metrics]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.3 * len(metrics), 3.8), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        if m not in df:
            ax.set_visible(False)
            continue
        for i, lab in enumerate(labels):  # markers shrink line by line: equal results stay visible
            d = df[df["_series"] == lab]
            ax.plot(d[x].astype(float), d[m].astype(float), marker=MARKERS[i % len(MARKERS)], ms=_ms(i, len(labels)),
                    mfc="none" if i else colors[lab], color=colors[lab], label=lab)
        if m == "goodput" and "request_throughput" in df:  # the ceiling goodput is measured against
            for lab in labels:
                d = df[df["_series"] == lab]
                ax.plot(d[x].astype(float), d["request_throughput"].astype(float), ls=":", color=colors[lab],
                        alpha=0.6)
        if m.endswith("_ms"):
            log_axis(ax, "y")
        if logx:
            log_axis(ax, "x")
        ax.set_xlabel(label_of(x))
        ax.set_ylabel(label_of(m))
        ax.grid(alpha=0.3, which="both")
    keys = [by] if isinstance(by, str) else list(by)
    handles = [plt.Line2D([], [], color=colors[lab], marker=MARKERS[i % len(MARKERS)], ms=_ms(i, len(labels)),
                          mfc="none" if i else colors[lab], label=lab) for i, lab in enumerate(labels)]
    if "goodput" in metrics:
        handles.append(plt.Line2D([], [], color="grey", ls=":", label="throughput\n(all finished)"))
    fig.tight_layout()
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, framealpha=0.85,
               title=", ".join(k.split(".")[-1] for k in keys), title_fontsize=9)
    fig.suptitle(title or f"latency and goodput against load, by {by if isinstance(by, str) else ', '.join(by)}",
                 y=1.02)
    return fig


# ---- a few requests' lifetimes -----------------------------------------------------------------
def pick_requests(requests: pd.DataFrame, n: int = 12, start: float = 0.5) -> list[int]:
    """n consecutive finished requests (by arrival) starting at the given fraction of the run:
    neighbours in time, so the Gantt view shows them contending for the same steps."""
    if n < 1 or not 0 <= start <= 1:
        raise ValueError(f"n={n}, start={start}: n must be >= 1 and start a fraction of the run in [0, 1]")
    done = M.finished(requests).sort_values(["arrival_s", "rid"])
    if not len(done):
        return []
    i = min(int(len(done) * start), max(len(done) - n, 0))
    return list(done["rid"].iloc[i:i + n])


def _chunk_spans(r, steps: pd.DataFrame | None) -> list[tuple[float, float]]:
    """Each prefill chunk of a request as (start, end): from the step it was scheduled in
    (steps.parquet's start_s) to that step's end; without steps, a sliver at its start."""
    times = r.chunk_times_s if "chunk_times_s" in r and r.chunk_times_s is not None else []
    spans = []
    for t in np.asarray(times, float):
        end = np.nan
        if steps is not None and len(steps):
            i = int(np.searchsorted(steps["start_s"].to_numpy(), t))
            for j in (i, i - 1):  # the step scheduled at t
                if 0 <= j < len(steps) and abs(steps["start_s"].iat[j] - t) < 1e-9:
                    end = float(steps["end_s"].iat[j])
        spans.append((float(t), end))
    return spans


def gantt(requests: pd.DataFrame, rids=None, n: int = 12, title: str | None = None, ax=None,
          steps: pd.DataFrame | None = None):
    """Per request: queued (arrival -> first scheduled), prefill (-> first token; pale where the
    request waits between chunks, each chunk solid: from the step it ran in to that step's end
    when ``steps`` (the job's steps.parquet) is given, else a mark at its start), decode
    (-> finish) with a tick per output token. One job's requests only."""
    if "job" in requests and requests["job"].nunique() > 1:
        raise ValueError("gantt draws one job: pass results.job(name).requests")
    rids = pick_requests(requests, n) if rids is None else list(rids)
    unknown = sorted(set(rids) - set(requests["rid"]))
    if unknown:
        raise ValueError(f"rids {unknown[:10]} are not in these requests (rids {requests['rid'].min()}.."
                         f"{requests['rid'].max()})" if len(requests) else f"rids {unknown[:10]}: no requests")
    d = requests.set_index("rid").loc[rids].reset_index().sort_values(["arrival_s", "rid"], ascending=False)
    steps = steps.sort_values("start_s").reset_index(drop=True) if steps is not None else None
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.42 * len(d) + 1.6))
    colors = {"queued": "#bbbbbb", "prefill": "#e8912d", "decode": "#3a78b5"}
    t_end = float(np.nanmax(d["finish_s"])) if len(d) else 1.0
    sliver = t_end * 2e-3
    for y, (_, r) in enumerate(d.iterrows()):
        segs = [("queued", r.arrival_s, r.first_scheduled_s), ("prefill", r.first_scheduled_s, r.first_token_s),
                ("decode", r.first_token_s, r.finish_s)]
        for name, a, b in segs:
            if pd.notna(a) and pd.notna(b) and b >= a:
                ax.barh(y, max(b - a, t_end * 1e-4), left=a, height=0.6, color=colors[name],
                        alpha=0.35 if name == "prefill" else 1.0, edgecolor="none")
        for a, b in _chunk_spans(r, steps):
            ax.barh(y, (b - a) if pd.notna(b) and b > a else sliver, left=a, height=0.6, color=colors["prefill"],
                    edgecolor="black", lw=0.4)
        t = r.token_times_s
        if t is not None and len(t) and len(t) <= 2000:
            ax.vlines(np.asarray(t, float), y - 0.3, y - 0.15, color="white", lw=0.25, alpha=0.6)
        note = f"{int(r.prompt_tokens)} in / {int(r.output_tokens)} out, {int(r.prefill_chunks)} chunk" + \
               ("s" if r.prefill_chunks != 1 else "")
        if r.prefix_cached_tokens:
            note += f", {int(r.prefix_cached_tokens)} cached"
        if r.preemptions:
            note += f", {int(r.preemptions)} preempted"
        ax.text((r.finish_s if pd.notna(r.finish_s) else r.arrival_s) + t_end * 0.005, y, note, va="center",
                fontsize=7.5)
    ax.set_yticks(range(len(d)))
    ax.set_yticklabels([f"rid {int(x)}" for x in d["rid"]], fontsize=8)
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("request")
    lo = float(np.nanmin(d["arrival_s"])) if len(d) else 0.0
    ax.set_xlim(lo - (t_end - lo) * 0.02, t_end + (t_end - lo) * 0.35)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors["queued"]),
               plt.Rectangle((0, 0), 1, 1, color=colors["prefill"], alpha=0.35),
               plt.Rectangle((0, 0), 1, 1, color=colors["prefill"], ec="black", lw=0.4),
               plt.Rectangle((0, 0), 1, 1, color=colors["decode"])]
    ax.legend(handles, ["queued", "prefill: waiting between chunks", "prefill: a chunk's step",
                        "decode (ticks: tokens)"], fontsize=8, loc="lower right", framealpha=0.9)
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(title or "request timelines")
    if fig:
        fig.tight_layout()
    return fig or ax.figure


# ---- KV pool and batches over time ---------------------------------------------------------------
def kv_timeline(steps: pd.DataFrame, bin_s: float | None = None, title: str | None = None):
    """Three panels over time: the KV pool (pages used by requests, held by the prefix cache,
    free, stacked, as % of the pool), the batch mix (prefill and decode tokens per second),
    and running / waiting requests. One job's steps only; bin_s defaults to ~300 bins."""
    if "job" in steps and steps["job"].nunique() > 1:
        raise ValueError("kv_timeline draws one job: pass results.job(name).steps")
    if not len(steps):
        raise ValueError("kv_timeline: no steps to draw (the job ran none)")
    span = float(steps["end_s"].max() - steps["start_s"].min())
    bin_s = _nice_bin(span / 300) if bin_s is None else bin_s
    kv = M.kv_timeline(steps, bin_s)
    bc = M.batch_composition(steps, bin_s)
    fig, axes = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True)
    total = (kv["pages_used"] + kv["pages_cached"] + kv["pages_free"]).max()
    ax = axes[0]
    ax.stackplot(kv["time_s"], 100 * kv["used_frac"], 100 * kv["cached_frac"], 100 * kv["free_frac"],
                 labels=["used by requests", "prefix cache (evictable)", "free"],
                 colors=["#3a78b5", "#8fbf6a", "#eeeeee"])
    ax.set_ylabel("KV pool (% of pages)")
    ax.set_ylim(0, 100)
    ev = kv["evicted_pages"].sum()
    ax.set_title(f"KV pool: {int(total):,} pages" + (f", {int(ev):,} pages evicted" if ev else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper right", framealpha=0.85)
    ax = axes[1]
    ax.stackplot(bc["time_s"], bc["decode_tok_s"], bc["prefill_tok_s"], labels=["decode", "prefill"],
                 colors=["#3a78b5", "#e8912d"], step="post")
    ax.set_ylabel("tokens computed per s")
    ax.set_title(f"batch composition (mean over {bin_s:g} s bins)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right", framealpha=0.85)
    ax = axes[2]
    ax.plot(kv["time_s"], kv["running"], label="running", color="#3a78b5")
    ax.plot(kv["time_s"], kv["waiting"], label="waiting", color="#c0392b")
    if kv["preempted"].sum():
        p = kv[kv["preempted"] > 0]
        ax.scatter(p["time_s"], np.zeros(len(p)), marker="|", color="black", label="preemption", zorder=3)
    ax.set_ylabel("requests")
    ax.set_xlabel("time since run start (s)")
    ax.legend(fontsize=8, loc="upper right", framealpha=0.85)
    for a in axes:
        a.grid(alpha=0.3)
    fig.suptitle(title or "KV cache and batches over time")
    fig.tight_layout()
    return fig


def _nice_bin(x: float) -> float:
    if x <= 0:
        return 1.0
    e = 10 ** np.floor(np.log10(x))
    for m in (1, 2, 5, 10):
        if x <= m * e:
            return float(m * e)
    return float(10 * e)


# ---- generic ---------------------------------------------------------------------------------------
def bars(df: pd.DataFrame, x: str, y: str, hue: str | None = None, title: str | None = None, ax=None):
    """Grouped bars of y by x (and hue): e.g. hit rate by eviction policy and queue order."""
    M.require_columns(df, "bars", (x, y, hue))
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
    xs = list(dict.fromkeys(df[x].map(_fmt)))
    hues = list(dict.fromkeys(df[hue].map(_fmt))) if hue else [None]
    colors = _colors(hues)
    w = 0.8 / len(hues)
    for i, h in enumerate(hues):
        d = df if h is None else df[df[hue].map(_fmt) == h]
        vals = [d.loc[d[x].map(_fmt) == xv, y].mean() for xv in xs]
        ax.bar(np.arange(len(xs)) + (i - (len(hues) - 1) / 2) * w, vals, w, label=h, color=colors[h])
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs)
    ax.set_xlabel(label_of(x))
    ax.set_ylabel(label_of(y))
    ax.grid(alpha=0.3, axis="y")
    if hue:
        ax.legend(title=label_of(hue), fontsize=8, title_fontsize=8, framealpha=0.85)
    ax.set_title(title or f"{label_of(y)} by {label_of(x)}")
    return fig or ax.figure
