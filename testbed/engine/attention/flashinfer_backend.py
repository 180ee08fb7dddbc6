"""flashinfer paged attention (CUDA). ``flashinfer`` is imported when the backend is built,
so CPU code never needs it.

Per step, :meth:`prepare` turns the batch's raw-slot page table into flashinfer's page
table (page ids = slot of every page_size-th position // page_size, plus last-page lengths)
and plans one wrapper: ``BatchDecodeWithPagedKVCacheWrapper`` for decode batches, else
``BatchPrefillWithPagedKVCacheWrapper`` (causal; the mask is aligned to the end of the
context, so cached prefixes and mixed decode/prefill batches work). Every layer then only
runs attention (its new K/V are in the pool already): the first through ``run``, the others
through the compiled call that run made (testbed/engine/attention/layer_call.py).
"""

from __future__ import annotations

import torch

from testbed.engine.attention import ATTENTION_BACKENDS, layer_call
from testbed.engine.attention.base import AttentionBackend
from testbed.engine.forward_batch import ForwardBatch, paged_kv_layout
from testbed.engine.options import PREFILL_BACKENDS

__all__ = ["FlashInferAttentionBackend"]

DEFAULT_WORKSPACE_BYTES = 256 * 1024 * 1024


@ATTENTION_BACKENDS.register("flashinfer")
class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    _require_cuda = True  # tests swap in a CPU stand-in for the flashinfer module

    def __init__(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        sm_scale: float | None = None,
        workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
        decode_use_tensor_cores: bool | None = None,
        prefill_backend: str = "fa2",
    ) -> None:
        super().__init__(num_qo_heads, num_kv_heads, head_dim, dtype, device, sm_scale)
        try:
            import flashinfer
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise ImportError(
                "attention backend 'flashinfer' needs the flashinfer package (and a CUDA "
                "device); use attention_backend='torch' on CPU"
            ) from e
        if self._require_cuda and self.device.type != "cuda":
            raise ValueError(f"attention backend 'flashinfer' runs on CUDA, got device {self.device}")
        if prefill_backend not in PREFILL_BACKENDS:
            raise ValueError(f"flashinfer prefill backend {prefill_backend!r} is not one of {', '.join(PREFILL_BACKENDS)}")
        if decode_use_tensor_cores is None:
            # The tensor-core (prefill-kernel) decode path pays off for wide GQA groups.
            decode_use_tensor_cores = num_qo_heads // num_kv_heads >= 4
        self.workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=self.device)
        # One workspace for both: only one of the two wrappers runs in a step.
        # Kernel templates are pinned, not "auto" (which picks fa3 on Hopper): each is a
        # module to prebuild (testbed/engine/attention/aot.py). The tensor-core decode path
        # runs the fa2 prefill template: fa3's paged decode at page size 1 measured 3x slower
        # on the H200 (Llama-3.1-8B, batch 256 x 1,024: 55.7 ms a step against 18.3 ms).
        self.prefill_backend = prefill_backend
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", backend=prefill_backend)
        self._tensor_cores = decode_use_tensor_cores
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", use_tensor_cores=decode_use_tensor_cores, **self._decode_backend()
        )
        self._use(None)

    def prepare(self, fb: ForwardBatch) -> None:
        pool = self.pool
        if fb.page_size != pool.page_size:
            raise ValueError(f"batch page_size {fb.page_size} != KV pool page_size {pool.page_size}")
        # flashinfer reads indptrs and last-page lengths on the host while planning: derive
        # them from the batch's host copies (no sync when it has them, else one small one per
        # step, never per layer); page ids stay on the device.
        page_indptr, page_ids, last_page_len = paged_kv_layout(
            fb.host_kv_indptr(), fb.kv_indices.to(self.device), fb.page_size
        )
        if fb.is_decode:
            self.plan_decode(self._decode, page_indptr, page_ids, last_page_len, fb.page_size)
        else:
            # plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
            #      num_qo_heads, num_kv_heads, head_dim_qk, page_size, causal=...)
            qo_indptr = fb.host_qo_indptr().int()
            self._prefill.plan(
                qo_indptr, page_indptr, page_ids, last_page_len,
                self.num_qo_heads, self.num_kv_heads, self.head_dim, fb.page_size, causal=True,
                **self._options(),
            )
            self._use(self._prefill)

    def _use(self, wrapper) -> None:
        """The planned wrapper this step's layers run; its call is recorded on the first layer."""
        self._wrapper = wrapper
        self._layer_call = None
        self._recorded = False

    @property
    def decode_tensor_cores(self) -> bool:
        """Whether decode runs flashinfer's tensor-core (prefill) kernel rather than its CUDA-core one."""
        return self._tensor_cores

    def _options(self) -> dict:
        return dict(sm_scale=self.sm_scale, q_data_type=self.dtype, kv_data_type=self.pool.dtype)

    def plan_decode(self, wrapper, page_indptr, page_ids, last_page_len, page_size: int) -> None:
        """Plan a decode wrapper (the step's own, or a CUDA graph's) and use it for this step."""
        # plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size)
        wrapper.plan(page_indptr, page_ids, last_page_len, self.num_qo_heads, self.num_kv_heads,
                     self.head_dim, page_size, **self._options())
        self._use(wrapper)

    def graph_decode_wrapper(self, batch_size: int, indices_buffer: torch.Tensor):
        """A decode wrapper whose metadata lives in fixed buffers, for one captured batch size."""
        import flashinfer

        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", use_cuda_graph=True, use_tensor_cores=self._tensor_cores,
            paged_kv_indptr_buffer=torch.empty(batch_size + 1, dtype=torch.int32, device=self.device),
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=torch.empty(batch_size, dtype=torch.int32, device=self.device),
            **self._decode_backend(),
        )

    def _decode_backend(self) -> dict:
        return {"backend": "fa2"} if self._tensor_cores else {}

    def attend(self, layer_id: int, q: torch.Tensor, fb: ForwardBatch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        if self._wrapper is None:
            raise RuntimeError("FlashInferAttentionBackend.attend before prepare(fb)")
        q = q.contiguous()
        if out is None:  # with out=None the wrapper would zero-fill a new one: a kernel more
            out = torch.empty_like(q)
        k, v = self.pool.paged(layer_id)
        if self._layer_call is not None:
            return self._layer_call(q, k, v, out)
        if self._recorded:  # the first layer's call could not be recorded
            return self._wrapper.run(q, (k, v), out=out)
        self._recorded = True
        res, self._layer_call = layer_call.record(self._wrapper, q, k, v, out)
        return res
