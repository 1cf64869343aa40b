"""The drafting policy's state on the GPU, and its step without a host sync (:class:`DevicePolicy`).

``DraftPolicy.step`` (the host's policy for a batch without a neural
drafter) decides on the host, so a GPU engine would copy every row's match
length back each step. :class:`DevicePolicy` keeps the same state on the
device, keyed by the engine's device slot (no host row bookkeeping): each
match bucket's counts and estimates, each slot's own evidence and the offer
it made last step; and one :meth:`DevicePolicy.step` is one launch of
``saspec.device.policy_kernel.decide_kernel`` on torch's current stream, with no
host sync and no allocation, so it can be captured in a CUDA graph. Its
lengths, sources and estimates are ``DraftPolicy.step``'s (the same
functions, compiled for CUDA), given the same inputs, with the rows' slots
as the host's request ids.

The step-cost table stays on the host, where the step timings are observed
(:meth:`DevicePolicy.observe_step`); its corrections are copied to the
device (from pinned memory, non-blocking, on the current stream) at the next
step after they changed, and only then.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the state is numpy
arrays and the arguments numpy arrays or CPU tensors, as for
``SpecEngine(backend="cuda")``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..acceptance import N_BUCKETS, bucket_priors, estimate
from ..allocation import HIST_ROWS, N_BINS, STATS, running_rate
from ..policy_settings import PolicySettings, check_settings, engine_cost
from ..step_cost import StepCost
from ..validate import array_span, check_count
from .policy_kernel import decide_kernel
from .runtime import new_device

#: The most rows x K of a step: the histogram's fixed-point sums stay exact below it (saspec.allocation.FIX).
MAX_ROW_TOKENS = 1 << 21
_ROW_ARGS = ("match", "offered", "branched", "new_lens", "slots", "lengths_out", "sources_out")


class DevicePolicy:
    """The drafting policy's step on a CUDA device, for an engine without a neural drafter.

    Each step the engine calls :meth:`step` with each row's match, offer, emitted tokens and device slot;
    it writes each row's draft length and source into the given device tensors. Timings go to
    :meth:`observe_step` (host); a slot whose request finished is :meth:`forget`-ten before it is reused.

    Args:
        k_max: the most automaton draft tokens per row (>= 1).
        slots: the state's slots (the engine's device slots: rows name theirs), >= 1.
        max_rows: the most rows of a step (default ``slots``); ``max_rows * k_max`` below 2**21.
        cost: the engine's host :class:`~saspec.step_cost.StepCost` (default: the ``gpu_like`` prior, or
            ``settings.cost_shape``, up to ``max_rows * (k_max + 1)`` tokens).
        settings: :class:`~saspec.policy.PolicySettings` (its ``prior_weight``, ``row_memory``,
            ``step_tolerance`` and ``rate_memory`` are used; default all defaults).
        device: the torch CUDA device (default torch's current one; unused under the simulator).

    Raises:
        ValueError: a setting out of range; RuntimeError: no CUDA device (and no simulator).

    Attributes:
        cost: the host step-cost model (read-only; its changes are uploaded).
        uploads: how many times the cost table's corrections were copied to the device.
    """

    def __init__(self, k_max: int, slots: int, *, max_rows: int | None = None, cost: StepCost | None = None,
                 settings: PolicySettings | None = None, device: Any = None) -> None:
        self.k_max = check_count(k_max, "k_max")
        self.slots = check_count(slots, "slots")
        self.max_rows = check_count(self.slots if max_rows is None else max_rows, "max_rows")
        if self.max_rows * self.k_max >= MAX_ROW_TOKENS:
            raise ValueError(f"max_rows * k_max must be below {MAX_ROW_TOKENS}, got {self.max_rows * self.k_max}")
        self.settings = settings if settings is not None else PolicySettings()
        v = check_settings(self.settings)
        self._decay, self._w, self._tol = v["row_memory"], v["prior_weight"], v["step_tolerance"]
        self._rate_memory = v["rate_memory"]
        if cost is None:
            cost = engine_cost(self.settings, "cuda", self.max_rows * (self.k_max + 1))
        if not isinstance(cost, StepCost):
            raise ValueError(f"cost must be a saspec.policy.StepCost, got {type(cost).__name__}")
        self._cost = cost
        self._dev = new_device(device)
        self._sim = bool(self._dev.simulated)
        rowf = np.zeros((3, self.slots))
        rowf[0] = 1.0
        bk = np.zeros((5, 3 * N_BUCKETS))
        bk[2] = bucket_priors()
        estimate(bk, self._w)
        curve, index, knot = cost.arrays()[:3]
        host = {"rowf": rowf, "prev": np.zeros((self.slots, self.k_max + 3), np.int32), "bk": bk,
                "probs": np.zeros((self.max_rows, self.k_max + 1)), "hist": np.zeros((HIST_ROWS, N_BINS)),
                "st": np.zeros(len(STATS), np.int64), "last": np.array([-1, 0, 0, 0, 0], np.int64),
                "last_slots": np.full(self.max_rows, -1, np.int32), "rate": np.zeros(5), "curve": curve.copy(),
                "index": index.copy(),
                "knot": knot.copy()}
        self._uploaded = knot[2].copy()
        self.uploads = 0
        self._timed = self._ignored = 0
        if self._sim:
            self._arrays = host
            self._views = tuple(host.values())
            return
        import torch
        from numba import cuda

        self._torch = torch
        self._arrays = {name: torch.from_numpy(a).to(self._dev.device) for name, a in host.items()}
        self._views = tuple(cuda.from_cuda_array_interface(t.__cuda_array_interface__, owner=None, sync=False)
                            for t in self._arrays.values())
        self._pinned = [torch.empty(knot.shape[1], dtype=torch.float64, pin_memory=True) for _ in range(2)]
        self._events: list[Any] = [None, None]
        self._next = 0
        torch.cuda.current_stream(self._dev.device).synchronize()  # the state is in place before any step

    @property
    def cost(self) -> StepCost:
        return self._cost

    # -- the step --

    def step(self, match: Any, offered: Any, branched: Any, drafts: Any, new: Any, new_lens: Any, slots: Any,
             lengths_out: Any, sources_out: Any) -> None:
        """One step: where the rows are the last step's (the same slots in the same order, none forgotten
        since), the last step's offers scored against what each row emitted; then each row's draft length
        and source, as ``DraftPolicy.step`` chooses them. Enqueued on torch's current stream; returns at once.

        Args (int32 CUDA tensors, C-contiguous; numpy arrays or CPU tensors under the simulator):
            match: [B]: each row's match length (<= 0: no automaton draft).
            offered: [B]: the automaton draft tokens on offer per row (cut to ``k_max``).
            branched: [B]: 1 where the row's match went on with several tokens earlier.
            drafts: [B, >= 1]: the offered drafts (kept, up to ``k_max`` tokens, for the next step).
            new: [B, >= 0]: the tokens each row emitted since the last step.
            new_lens: [B]: how many (0: none).
            slots: [B]: each row's slot in ``[0, slots)``, distinct (a row outside gets no draft, changes
                nothing).
            lengths_out: [B]: each row's draft length (written).
            sources_out: [B]: each row's source (``saspec.policy.NONE`` / ``AUTOMATON``; written).

        Raises:
            TypeError, ValueError: an argument of another type, dtype, device or shape, more than
                ``max_rows`` rows, or an output that overlaps another argument (nothing is enqueued).
        """
        dev = self._dev
        args = (match, offered, branched, drafts, new, new_lens, slots, lengths_out, sources_out)
        names = ("match", "offered", "branched", "drafts", "new", "new_lens", "slots", "lengths_out", "sources_out")
        checked = [dev.check(x, name, 2 if name in ("drafts", "new") else 1, writable=name.endswith("_out"))
                   for x, name in zip(args, names)]
        b = int(checked[0].shape[0])
        for x, name in zip(checked, names):
            if int(x.shape[0]) != b:
                raise ValueError(f"{name} must have {b} rows (as match), got shape {tuple(x.shape)}")
        if int(checked[3].shape[1]) < 1:
            raise ValueError("drafts must have at least one column")
        if b > self.max_rows:
            raise ValueError(f"at most {self.max_rows} rows (max_rows), got {b}")
        spans = [array_span(x) for x in checked]
        for i in (7, 8):
            for j, other in enumerate(spans):
                if j != i and spans[i] is not None and other is not None and spans[i][0] < other[1] \
                        and other[0] < spans[i][1]:
                    raise ValueError(f"{names[i]} overlaps {names[j]}")
        self._upload_cost()
        threads = min(max(b, 1), 4) if self._sim else min(256, 32 * max(1, -(-b // 32)))
        views = checked if self._sim else [dev.view(x) for x in checked]
        dev.launch(decide_kernel, 1, threads, *views, *self._views, self._decay, self._w, self._tol,
                   self._rate_memory)

    def _upload_cost(self) -> None:
        """Copy the cost table's corrections to the device where they changed since the last copy."""
        knot = self._cost.arrays()[2]
        if np.array_equal(knot[2], self._uploaded):
            return
        self._uploaded[:] = knot[2]
        self.uploads += 1
        if self._sim:
            self._arrays["knot"][2] = knot[2]
            return
        torch = self._torch
        i = self._next
        self._next ^= 1
        with torch.cuda.device(self._dev.device):
            if self._events[i] is not None:
                self._events[i].synchronize()  # the copy from this buffer two uploads ago (long done)
            self._pinned[i].numpy()[:] = knot[2]
            self._arrays["knot"][2].copy_(self._pinned[i], non_blocking=True)
            if self._events[i] is None:
                self._events[i] = torch.cuda.Event()
            self._events[i].record(torch.cuda.current_stream(self._dev.device))

    # -- what followed --

    def observe_step(self, tokens: int, seconds: float) -> bool:
        """The step's target forward verified ``tokens`` tokens in ``seconds`` (host): the cost model learns
        it, and the device's table follows at the next :meth:`step`. Returns whether it was taken (a timing
        not finite and > 0 is ignored, counted)."""
        taken = self._cost.observe(int(tokens), seconds)
        if taken:
            self._timed += 1
        else:
            self._ignored += 1
        return taken

    def forget(self, slot: int) -> None:
        """A finished request's slot: its evidence and kept offer dropped; where the slot was one of the last
        step's rows, those rows are no longer the last step's (the next step scores nothing, as the host's
        policy does when a row's request changed). Enqueued on the current stream, without a sync.

        Raises:
            ValueError: a slot outside ``[0, slots)``.
        """
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= int(slot) < self.slots:
            raise ValueError(f"slot must be an int in [0, {self.slots}), got {slot!r}")
        a, s = self._arrays, int(slot)
        a["rowf"][0, s] = 1.0
        a["rowf"][1:, s] = 0.0
        a["prev"][s, 1] = 0
        last_slots = a["last_slots"]
        if self._sim:
            last_slots[last_slots == s] = -2
        else:
            last_slots.masked_fill_(last_slots == s, -2)

    # -- inspection (each copies from the device: a sync) --

    def _host(self, name: str) -> np.ndarray:
        x = self._arrays[name]
        return x.copy() if self._sim else x.cpu().numpy()

    @property
    def stats(self) -> dict[str, int]:
        """``DraftPolicy.stats``' counters for the steps run here (``timed`` / ``ignored_timings``: the
        timings :meth:`observe_step` took or ignored)."""
        out = dict(zip(STATS, self._host("st").tolist()))
        out["timed"], out["ignored_timings"] = self._timed, self._ignored
        return out

    @property
    def p_bucket(self) -> np.ndarray:
        """float64 [3 * N_BUCKETS]: each match bucket's estimated acceptance (as ``DraftPolicy.p_bucket``)."""
        return self._host("bk")[3]

    @property
    def running_rate(self) -> float:
        """The running rate, tokens a second (as ``DraftPolicy.running_rate``; reading it waits for the device)."""
        return float(running_rate(self._host("rate"), *(self._host(n) for n in ("curve", "index", "knot")))) \
            if self._rate_memory > 0.0 else 0.0

    def evidence(self, slot: int) -> tuple[float, float, float]:
        """Slot ``slot``'s own evidence: its odds factor, hits and misses."""
        return tuple(float(v) for v in self._host("rowf")[:, slot])
