"""CUDA graphs for the eager steps (prefill chunks, mixed batches, decode batches beyond the
decode graphs), captured in pieces between the attention calls.

Why: an eager step launches ~9 kernels a layer from Python. On the H200 machine that
enqueueing took ~11 ms a Qwen3-0.6B step against 1.5-3 ms of device time, so those steps
were host-bound and their time followed the host's speed, which drifts. Only attention
depends on the batch's structure (its requests and contexts; flashinfer plans it on the host
each step); the rest of a layer depends only on the number of tokens. So for each padded
token count the work between two attention calls is one graph:

    piece 0   embedding, RoPE, layer 0's norm, qkv, q/k norm + RoPE, K/V store  -> q
    piece i   layer i-1's o_proj, norm, MLP; layer i's norm, qkv, ...           -> q
    piece L   layer L-1's o_proj, norm, MLP                                      -> x

A step copies its batch into fixed buffers, plans attention once, replays piece 0, then per
layer runs attention eagerly (q and its output are fixed buffers) and replays the next piece;
the final norm and the LM head run eagerly on the requests' last rows. That is L + 1 graph
launches and L attention calls instead of ~9 L launches.

Padding: a step of T tokens runs in the smallest captured size >= T (every 16 tokens up to
256, then 8 sizes per doubling: at most 12.5% padding). Padding rows take whatever token and
position the buffers held (valid ones: earlier steps' or zeros), write their K/V into the
scratch page the scheduler never hands out (as the decode graphs' padding does), are left out
of attention (it runs on the T real rows) and are never read back.

All pieces of all sizes share one memory pool: a step replays its pieces in the order they
were captured and sizes never interleave, so what a piece leaves in the pool is read only
through the fixed buffers. ``capture=False`` runs the same pieces without graphs (the CPU
tests check it against the plain forward)."""
from __future__ import annotations

import torch

from testbed.engine.forward_batch import ForwardBatch

__all__ = ["PiecewiseGraphs", "token_sizes"]


def token_sizes(max_tokens: int) -> list[int]:
    """The captured token counts: every 16 up to 256, then 8 per doubling, up to max_tokens
    (itself included, rounded up to 16)."""
    top = -(-max(max_tokens, 1) // 16) * 16
    sizes, s = [], 16
    while s < top:
        sizes.append(s)
        s += 16 if s < 256 else max(16, (1 << (s.bit_length() - 1)) // 8)
    return sizes + [top]


class PiecewiseGraphs:
    def __init__(self, model, device: torch.device, max_tokens: int, scratch_slot: int, capture: bool = True):
        self.model, self.device = model, torch.device(device)
        self.backend = model.attn_backend
        self.scratch_slot = scratch_slot
        self.sizes = token_sizes(max_tokens)
        self.max_tokens = self.sizes[-1]
        cfg, attn = model.config, model.layers[0].self_attn
        n, dt = self.max_tokens, model.dtype
        self.num_layers = cfg.num_layers
        # the fixed buffers every piece of every size reads and writes (the first n rows)
        self.ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.pos = torch.zeros(n, dtype=torch.int64, device=device)
        self.loc = torch.full((n,), scratch_slot, dtype=torch.int32, device=device)
        self.cos = torch.zeros(n, cfg.head_dim // 2, dtype=torch.float32, device=device)
        self.sin = torch.zeros_like(self.cos)
        self.q = torch.zeros(n, attn.num_heads, cfg.head_dim, dtype=dt, device=device)
        self.o = torch.zeros_like(self.q)
        self.res = torch.zeros(n, cfg.hidden_size, dtype=dt, device=device)
        self.x = torch.zeros_like(self.res)
        self.pieces: dict[int, list] = {}
        self.whole = None  # the eager steps captured whole (whole_graphs.py), when the engine has them
        pool = torch.cuda.graph_pool_handle() if capture else None
        for s in reversed(self.sizes):  # largest first: the smaller sizes reuse its memory
            fns = [self._piece_fn(s, i) for i in range(self.num_layers + 1)]
            if not capture:
                self.pieces[s] = fns
                continue
            for fn in fns:  # once outside the graph: Triton compiles, cuBLAS picks, the allocator grows
                fn()
            torch.cuda.synchronize(self.device)
            graphs = []
            for fn in fns:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    fn()
                graphs.append(g.replay)
            self.pieces[s] = graphs
        if capture:
            torch.cuda.synchronize(self.device)

    @property
    def num_graphs(self) -> int:
        return len(self.sizes) * (self.num_layers + 1)

    def _piece_fn(self, s: int, i: int):
        """Piece i of size s as a function of the fixed buffers (see the module docstring)."""
        layers, pool = self.model.layers, self.backend.pool
        rope = (self.cos[:s], self.sin[:s])
        loc, q, o, res = self.loc[:s], self.q[:s], self.o[:s], self.res[:s]

        @torch.inference_mode()
        def piece():
            if i == 0:
                x, (cos, sin) = self.model.embed(self.ids[:s], self.pos[:s])
                rope[0].copy_(cos)
                rope[1].copy_(sin)
                residual = None
            else:
                x, residual = layers[i - 1].after_attention(o, res)
            if i == self.num_layers:
                self.x[:s].copy_(x)
                res.copy_(residual)
                return
            _, residual = layers[i].before_attention(x, residual, rope, pool, loc, q_out=q)
            res.copy_(residual)
        return piece

    def fits(self, fb: ForwardBatch) -> bool:
        return 0 < fb.num_tokens <= self.max_tokens

    def size_for(self, num_tokens: int) -> int:
        return next(s for s in self.sizes if s >= num_tokens)

    @torch.inference_mode()
    def run(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits [requests, vocab] of the batch, as ``model(fb)`` computes them."""
        key = self.whole.key(fb) if self.whole is not None else None
        if key is not None:
            return self.whole.graphs[key].run(fb)
        T = fb.num_tokens
        s = self.size_for(T)
        self.ids[:T].copy_(fb.input_ids)
        self.pos[:T].copy_(fb.positions)
        self.loc[:T].copy_(fb.out_cache_loc)
        if s > T:
            self.loc[T:s].fill_(self.scratch_slot)
        self.backend.prepare(fb)
        pieces = self.pieces[s]
        q, o = self.q[:T], self.o[:T]
        pieces[0]()
        for i in range(self.num_layers):
            self.backend.attend(i, q, fb, out=o)
            pieces[i + 1]()
        return self.model.head(self.x[:s], self.res[:s], fb.last_token_index())
