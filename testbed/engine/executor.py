"""The engine's executor: runs an applied plan on the model and samples.

`launch(plan)` prepares the batch on the host, copies it over and enqueues the forward
pass and sampling on the device, without waiting; `collect(handle)` waits for that step
and returns its StepResult. `run(plan)` is both at once. The driver decides whether the
CPU prepares step N+1 between the two (overlap)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from testbed.core import BatchPlan, StepResult
from testbed.engine.batch_builder import HostBatch, build_host_batch
from testbed.engine.forward_batch import ForwardBatch
from testbed.engine.staging import PinnedUploader
from testbed.engine.sampling import SamplingTensors, sample


def sampling_lists(plan: BatchPlan, hb: HostBatch) -> tuple:
    """Per sampling row: temperature, top_k (0 = off), top_p, seed."""
    reqs = [plan.reqs[i] for i in hb.sample_idx]
    return ([r.sampling.temperature for r in reqs], [max(r.sampling.top_k, 0) for r in reqs],
            [r.sampling.top_p for r in reqs], [r.sampling.seed for r in reqs])


@dataclass
class StepHandle:
    plan: BatchPlan | None  # None on tensor-parallel workers
    tokens: torch.Tensor  # host (pinned on CUDA) copy of the sampled ids
    start_event: object
    end_event: object
    t_launch: float
    predicted: float | None
    prep_s: float = 0.0  # host time from launch() to the first kernel enqueued (batch build, upload)
    # the step loop's protocol: the engine's host work and device waits take real time
    host_done = None
    ready_at = None
    complete_cost = None


class DeferredPredictions:
    """The cost model's device time of every launched step, computed after the run: a mixed
    step's prediction costs ~0.1 ms of host time, which inside the step loop would be the
    engine's own host time (and is not in the profile's)."""

    def __init__(self, cost_model):
        self.cost_model = cost_model
        self.shapes: list[tuple[np.ndarray, np.ndarray]] = []

    def note(self, plan: BatchPlan) -> None:
        if self.cost_model is not None:
            self.shapes.append((plan.extend_lens, plan.cached_lens))

    def fill(self, steps) -> None:
        """steps.parquet's predicted_s, in launch order (= the log's order; a step launched but
        not collected when the run stopped has no row)."""
        if self.cost_model is None:
            return
        col = steps.cols["predicted_s"]
        for i, (n, c) in enumerate(self.shapes[: len(col)]):
            col[i] = self.cost_model.step_cost(n, c).device


class EngineExecutor:
    def __init__(self, model, device: torch.device, num_rows: int, scheduler=None, cost_model=None, graphs=None,
                 pieces=None):
        """num_rows: page-table rows (max running requests). scheduler: the page table
        to build batches from (None on tensor-parallel workers, which only launch_host).
        graphs: the decode CUDA graphs; pieces: the piecewise graphs of the other steps."""
        self.model = model
        self.sched = scheduler
        self.device = device
        self.cuda = device.type == "cuda"
        self.cost_model = cost_model
        self.predictions = DeferredPredictions(cost_model)
        self.graphs = graphs  # CUDA graphs for decode batches, or None
        self.pieces = pieces  # piecewise CUDA graphs for the other steps, or None
        # the last token each page-table row sampled: a decode's input while its step is in flight
        self.last_token = torch.zeros(num_rows, dtype=torch.int64, device=device)
        # pinned host buffers for the sampled ids, reused in turn (allocating pinned memory
        # each step would synchronise the device); three: one being written, one in flight, spare
        self._host = [torch.empty(num_rows, dtype=torch.int64, pin_memory=self.cuda) for _ in range(3)]
        self._turn = 0
        self._uploader = PinnedUploader(device) if self.cuda else None
        # the one stream the engine runs on, looked up once (current_stream() took 35 us a call
        # under cProfile on the H200 machine, three calls a step)
        self._stream = torch.cuda.current_stream(device) if self.cuda else None

    def launch(self, plan: BatchPlan) -> StepHandle:
        t_launch = time.perf_counter()
        hb = build_host_batch(plan, self.sched.page_table.table, self.sched.page_size)
        self.predictions.note(plan)  # predicted after the run (fill_predictions)
        return self.launch_host(hb, sampling_lists(plan, hb), plan, None, t_launch)

    def close(self, ran_to_end: bool) -> None:
        """Nothing runs beside this process (on one rank)."""

    def fill_predictions(self, steps) -> None:
        self.predictions.fill(steps)

    def launch_host(self, hb: HostBatch, sampling: tuple, plan: BatchPlan | None = None,
                    predicted: float | None = None, t_launch: float | None = None) -> StepHandle:
        """Run a prepared batch (what tensor-parallel workers receive from rank 0)."""
        t_launch = time.perf_counter() if t_launch is None else t_launch
        if hb.fb.batch_size > len(self.last_token):  # on CUDA an index past the row buffers is a device assert
            raise ValueError(f"a step of {hb.fb.batch_size} rows exceeds the engine's {len(self.last_token)} "
                             "page-table rows (scheduler.max_running)")
        start = end = None
        if self.cuda:
            # the step's device time starts before its uploads: everything it puts on the
            # stream is in its duration, so back-to-back steps leave no unmeasured gap
            # between them (the uploads and the pending-token gather took ~25 us a step)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(self._stream)
        fb, pending_at, pending_rows, sample_idx, sample_rows = self._to_device(hb)
        if len(hb.pending_at):
            fb.input_ids[pending_at] = self.last_token[pending_rows]
        params = SamplingTensors.build(*sampling, hb.sample_steps.tolist(), device=self.device)
        prep_s = time.perf_counter() - t_launch
        if self.graphs is not None and fb.is_decode and self.graphs.fits(fb):
            logits = self.graphs.run(fb)
        elif self.pieces is not None and self.pieces.fits(fb):
            logits = self.pieces.run(fb)
        else:
            logits = self.model(fb)
        if len(hb.sample_idx) < logits.shape[0]:  # rows mid-prefill sample nothing
            logits = logits[sample_idx]
        ids = sample(logits, params)
        self.last_token[sample_rows] = ids
        if self.cuda:
            host = self._host[self._turn][: ids.numel()]
            self._turn = (self._turn + 1) % len(self._host)
            host.copy_(ids, non_blocking=True)
            end.record(self._stream)
            self._uploader.release(end)  # the step's last op: its upload buffers are free after it
        else:
            host = ids
        return StepHandle(plan, host, start, end, t_launch, predicted, prep_s)

    def _to_device(self, hb: HostBatch):
        """The batch and the index arrays on the device: on CUDA through pinned staging
        buffers, one asynchronous copy per dtype."""
        f = hb.fb
        extra = [hb.pending_at, hb.pending_rows, hb.sample_idx, hb.sample_rows]
        if not self.cuda:
            return (f, *(torch.from_numpy(a) for a in extra))
        host = [f.input_ids, f.positions, f.qo_indptr, f.kv_indptr, f.kv_indices, f.out_cache_loc]
        dev = self._uploader.upload([t.numpy() for t in host] + [np.ascontiguousarray(a) for a in extra])
        fb = ForwardBatch(*dev[:6], is_decode=f.is_decode, page_size=f.page_size,
                          qo_indptr_cpu=f.qo_indptr, kv_indptr_cpu=f.kv_indptr)
        return (fb, *dev[6:])

    def collect(self, h: StepHandle) -> StepResult:
        if self.cuda:
            h.end_event.synchronize()
            duration = h.start_event.elapsed_time(h.end_event) / 1000.0
        else:
            duration = time.perf_counter() - h.t_launch
        return StepResult(duration=duration, tokens=h.tokens.numpy().astype(np.int64), predicted=h.predicted)

    def run(self, plan: BatchPlan) -> StepResult:
        return self.collect(self.launch(plan))
