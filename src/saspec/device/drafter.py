"""The drafting step on the GPU: :class:`DeviceDrafter`, ``saspec.Drafter``'s lifecycle over device automata.

::

    with DeviceDrafter(k=8, max_slots=256, max_seq_len=32768) as drafter:
        drafter.start("a", prompt_ids, options={"max_draft_tokens": 4})  # while the engine prefills "a"
        drafter.prepare(["a", "b"])                      # when the batch changes (uploads, the row map)
        drafter.step(accepted, accepted_lens, tokens, lengths, sources, match)  # torch CUDA tensors
        drafter.observe_step(verified_tokens, seconds)  # the forward's timing, from the host
        drafter.finish("a")                              # finished or aborted

The host calls (``start``, ``prepare``, ``finish``, ``observe_step``) keep the
request lifecycle, the cross-request pool and each request's options; one
:meth:`DeviceDrafter.step` is a fixed sequence of four kernel launches on
torch's current stream, with no host sync and no allocation, so it can be
captured in a CUDA graph:

1. ``SpecEngine.extend``: each row's accepted tokens appended to its device
   automaton, its match, draft and branch flag written (the pool's where longer);
2. ``drafter_kernels.offers_kernel``: each row's offer as the host's ``Drafter`` makes it (its
   match below ``min_match``: none; else its draft's real tokens, cut to K, to
   its request's cap and to the room left in its slot), the row's slot from the
   engine's device row map, and the rows that take no part (drafting off without
   a pool, past the prepared batch, no new tokens) zeroed;
3. ``saspec.device.policy_kernel.decide_kernel`` (``DevicePolicy.step``): each row's
   draft length and source under the step-cost table;
4. ``drafter_kernels.cut_kernel``: each row's draft cut to its length, -1 after.

A row's drafts never run past its slot's capacity (``max_seq_len`` tokens,
hints included), as the host's never run past ``width``; a row whose request
outgrew its slot reports match 0 and drafts nothing.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the tensors are
numpy int32 arrays or CPU tensors, as for ``SpecEngine(backend="cuda")``.
Importing this module imports ``numba.cuda`` (numba-cuda) and, on a GPU, torch.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import core
from ..engine import SpecEngine
from ..options import DEFAULT_OPTIONS, HINT_SEPARATOR, DraftOptions, parse_options
from ..policy_settings import PolicySettings, engine_cost
from ..step_cost import MAX_STEP_TOKENS, StepCost
from ..validate import array_span, as_tokens, check_count, check_int
from .drafter_kernels import cut_kernel, offers_kernel
from .policy import DevicePolicy
from .runtime import new_device

logger = logging.getLogger(__name__)

#: Rows whose match is shorter than this draft nothing by default: 1, as ``saspec.Drafter`` under its policy
#: (the policy weighs every match the automaton offers).
DEFAULT_MIN_MATCH = 1
_THREADS = 64


class DeviceDrafter:
    """The drafting step of an engine whose automata and policy live on a CUDA device (see the module doc).

    Args:
        k: the most draft tokens of a row (>= 1); a step's ``accepted`` is [B, K + 1], its drafts [B, K].
        max_slots: requests resident on the device at once (each started request takes one from its
            first :meth:`prepare` to its :meth:`finish`); also the most rows of a step.
        max_seq_len: tokens one request's automaton holds (its hints and separator, prompt and output).
        pool_tokens: the cross-request pool's size in tokens (0: none): finished requests' texts join it,
            and rows draft from it where their match there is longer.
        policy_settings: the policy's :class:`~saspec.policy.PolicySettings` (default all defaults).
        cost: the host :class:`~saspec.policy.StepCost` (default: ``gpu_like``, or the settings' shape, up
            to ``max_slots * (k + 1)`` tokens).
        min_match: rows whose match is shorter draft nothing (>= 1).
        device: the torch CUDA device (default torch's current one; unused under the simulator).

    Raises:
        ValueError, TypeError: a setting out of range or of the wrong type (named).
        RuntimeError: no CUDA device (and no simulator).

    Attributes:
        engine: the ``SpecEngine(backend="cuda")`` holding the automata.
        policy: the :class:`~saspec.device.policy.DevicePolicy`.
        pool: the cross-request pool (a ``RequestPool``) or None.

    Threads: the host calls are made from the engine's thread; builds run on one background thread.
    """

    def __init__(self, k: int, max_slots: int, max_seq_len: int, *, pool_tokens: int = 0,
                 policy_settings: PolicySettings | None = None, cost: StepCost | None = None,
                 min_match: int = DEFAULT_MIN_MATCH, device: Any = None) -> None:
        self.k = check_count(k, "k")
        self.max_slots = check_int(max_slots, "max_slots", 1)
        self.max_seq_len = check_int(max_seq_len, "max_seq_len", 1)
        self.min_match = check_int(min_match, "min_match", 1)
        check_int(pool_tokens, "pool_tokens", 0)
        settings = policy_settings if policy_settings is not None else PolicySettings()
        if not isinstance(settings, PolicySettings):
            raise TypeError(f"policy_settings must be a saspec.policy.PolicySettings, got {type(settings).__name__}")
        if cost is None:
            cost = engine_cost(settings, "cuda", min(self.max_slots * (self.k + 1), MAX_STEP_TOKENS))
        elif not isinstance(cost, StepCost):
            raise TypeError(f"cost must be a saspec.policy.StepCost, got {type(cost).__name__}")
        self.policy = DevicePolicy(self.k, self.max_slots, cost=cost, settings=settings, device=device)
        self.engine = SpecEngine(backend="cuda", max_slots=self.max_slots, max_seq_len=self.max_seq_len,
                                 device=device, pool_tokens=pool_tokens or None)
        self.pool = self.engine.request_pool
        self._slots = self.engine.device_slots
        self._dev = new_device(device)
        n, k1 = self.max_slots, self.k
        names = ("match", "branch", "lens", "offered", "row_slots", "caps")
        if self._dev.simulated:
            bufs = {name: np.zeros(n, np.int32) for name in names}
            bufs["draft"] = np.full((n, k1), -1, np.int32)
            self._caps_host = bufs["caps"]
        else:
            import torch

            dev = self._dev.device
            bufs = {name: torch.zeros(n, dtype=torch.int32, device=dev) for name in names}
            bufs["draft"] = torch.full((n, k1), -1, dtype=torch.int32, device=dev)
            self._caps_pinned = [torch.zeros(n, dtype=torch.int32, pin_memory=True) for _ in range(2)]
            self._caps_events: list[Any] = [None, None]
            self._caps_next = 0
            torch.cuda.current_stream(dev).synchronize()  # the buffers are in place before any step
        self._bufs = bufs
        self._rows_of: dict[int, tuple] = {}  # B -> the buffers' first B rows (and their kernel views)
        self._options: dict[Hashable, DraftOptions] = {}
        self._builds: dict[Hashable, Future] = {}  # builds started and not yet taken by a prepare
        self._builder: ThreadPoolExecutor | None = None
        self._batch: tuple[Hashable, ...] | None = None
        self._timing: tuple[int, float] | None = None  # the last forward's (tokens, seconds), not yet observed
        self._same = False  # the next step's rows are the last step's
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------

    def start(self, request_id: Hashable, prompt: Any, options: Any = None, max_new_tokens: int | None = None) -> None:
        """A new request: build its automaton (over its hints, ``HINT_SEPARATOR`` and its prompt) on a
        background thread (``SpecEngine.add_request`` releases the GIL), so it overlaps the engine's prefill;
        the :meth:`prepare` that first names it waits for the build and uploads it. Call it when the engine
        admits the request. A request with drafting off gets an empty automaton where no pool takes its text.

        Args:
            request_id: any hashable id, unique among the requests started and not finished.
            prompt: 1-D token ids (list, numpy array or CPU tensor) in [0, 2**31).
            options: the request's :class:`~saspec.options.DraftOptions`, a mapping with its keys, or None.
            max_new_tokens: accepted for ``Drafter``'s signature (a device slot holds ``max_seq_len`` tokens).

        Raises:
            KeyError: ``request_id`` was started and not finished.
            TypeError, ValueError: a bad prompt, option or ``max_new_tokens``, or hints and prompt longer than
                ``max_seq_len`` (named); nothing changes.
            RuntimeError: the drafter is closed.
        """
        self._check_open()
        if request_id in self._options:
            raise KeyError(f"request {request_id!r} is already started")
        tokens = as_tokens(prompt, "prompt")
        opts = parse_options(options, f"request {request_id!r} options")
        if max_new_tokens is not None:
            check_int(max_new_tokens, "max_new_tokens", 0)
        if opts.hints is not None:
            tokens = np.concatenate((opts.hints.astype(np.int32), np.array([HINT_SEPARATOR], np.int32), tokens))
        if not opts.drafts and self.pool is None:
            tokens = tokens[:0]  # never drafted for and no pool: its row still needs a slot
        if tokens.shape[0] > self.max_seq_len:
            raise ValueError(f"request {request_id!r}: its hints and prompt hold {tokens.shape[0]} tokens, more "
                             f"than max_seq_len={self.max_seq_len}")
        if self._builder is None:
            self._builder = ThreadPoolExecutor(1, thread_name_prefix="saspec-device-build")
        self._builds[request_id] = self._builder.submit(self.engine.add_request, request_id, tokens.copy())
        self._options[request_id] = opts

    def prepare(self, request_ids: Sequence[Hashable]) -> None:
        """Make ``request_ids`` the rows of the next steps (row ``b`` is ``request_ids[b]``): wait for their
        builds, upload the new ones into free device slots, write the row-to-slot map and each row's draft
        cap (from its options), all async on torch's current stream. Call it when the batch changes, and
        after a :meth:`finish` so that a grown pool reaches the device. A captured step follows it (it reads
        the map and the caps on the device) for at most the B rows it was captured with.

        Raises:
            KeyError: an id not started (or finished); ValueError: an id twice or more rows than
                ``max_slots``; RuntimeError: fewer free slots than new requests, a build that failed (named),
                or the drafter is closed. The batch is then unchanged.
        """
        self._check_open()
        ids = tuple(request_ids)
        if len(ids) > self.max_slots:
            raise ValueError(f"at most max_slots={self.max_slots} rows, got {len(ids)}")
        for r in ids:
            if r not in self._options:
                raise KeyError(f"request {r!r} was not started (DeviceDrafter.start) or is finished")
        for r in ids:
            fut = self._builds.get(r)
            if fut is not None:
                try:
                    fut.result()
                except Exception as exc:  # noqa: BLE001  (named for the caller, who may finish the request)
                    raise RuntimeError(f"building the automaton of request {r!r} failed: {exc!r}") from exc
                del self._builds[r]
        pool = self.pool
        blob = None if pool is None else pool.current[0]
        pool_new = blob is not None and blob is not self._slots.uploaded_pool and int(blob[core.H_N]) > 0
        if ids == self._batch and not pool_new:
            return
        self.engine.prepare(ids)
        if ids != self._batch:
            caps = np.full(self.max_slots, -1, np.int32)
            for i, r in enumerate(ids):
                o = self._options[r]
                if o is DEFAULT_OPTIONS:
                    caps[i] = self.k
                elif not o.drafts:
                    caps[i] = -1 if pool is None else 0
                else:
                    caps[i] = self.k if o.max_draft_tokens is None else min(o.max_draft_tokens, self.k)
            self._write_caps(caps)
            self._batch = ids
            self._same = False
            self._timing = None

    def _write_caps(self, caps: np.ndarray) -> None:
        """The rows' caps to the device: from pinned memory, non-blocking, on the current stream."""
        if self._dev.simulated:
            self._bufs["caps"][:] = caps
            return
        import torch

        i = self._caps_next
        self._caps_next ^= 1
        dev = self._dev.device
        with torch.cuda.device(dev):
            if self._caps_events[i] is not None:
                self._caps_events[i].synchronize()  # the copy from this buffer two batches ago (long done)
            self._caps_pinned[i].numpy()[:] = caps
            self._bufs["caps"].copy_(self._caps_pinned[i], non_blocking=True)
            if self._caps_events[i] is None:
                self._caps_events[i] = torch.cuda.Event()
            self._caps_events[i].record(torch.cuda.current_stream(dev))

    def finish(self, request_id: Hashable) -> None:
        """The request finished (or was aborted): its text joins the pool (if any; reading it from the device
        synchronizes), its slot is freed and the policy forgets it. Unknown ids are ignored. Waits for a
        build still running; a failed build is dropped."""
        opts = self._options.pop(request_id, None)
        if opts is None:
            return
        slot = self._slots.slot_of.get(request_id)
        fut = self._builds.pop(request_id, None)
        if fut is not None and not fut.cancel():
            try:
                fut.result()
            except Exception:  # noqa: BLE001  (nothing was added)
                logger.warning("saspec: the build of finished request %r had failed", request_id, exc_info=True)
        if request_id in self.engine:
            self.engine.remove_request(request_id)
        if slot is not None:
            self.policy.forget(slot)
        if self._batch is not None and request_id in self._batch:
            self._batch = None  # prepare again before the next step
            self._same = False
            self._timing = None

    def observe_step(self, tokens: int, seconds: float) -> None:
        """The last step's target forward verified ``tokens`` tokens in ``seconds`` (host timing): the cost
        table learns it at the next :meth:`step` where the rows stay the same (as the host ``Drafter``:
        a step after the batch changed is not timed), its corrections copied to the device then. Time only
        forwards that verified drafts alone: the host ``Drafter`` does not time one that also prefilled
        (a prefill token costs less than a verified one), and this object cannot tell without a sync."""
        self._timing = (int(tokens), float(seconds))

    def close(self) -> None:
        """Stop the builder thread and close the pool (idempotent)."""
        if not self._closed:
            self._closed = True
            if self._builder is not None:
                self._builder.shutdown(wait=True)
                self._builder = None
            self.engine.close()

    def __enter__(self) -> DeviceDrafter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._options

    def __len__(self) -> int:
        return len(self._options)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the drafter is closed")

    # -- the device step -------------------------------------------------------------

    def step(self, accepted: Any, accepted_lens: Any, tokens_out: Any, lengths_out: Any, sources_out: Any,
             match_out: Any) -> None:
        """One drafting step for the prepared batch: four kernel launches on torch's current stream, no host
        sync, no allocation (capturable in a CUDA graph; a replay repeats the launches only, not this call's
        host part, which feeds :meth:`observe_step`'s timing to the cost table and uploads its corrections).

        Args (int32 CUDA tensors, C-contiguous; numpy arrays or CPU tensors under the simulator; B rows, at
        least the prepared batch's and at most ``max_slots``; rows past the batch draft nothing):
            accepted: [B, K + 1]: each row's tokens emitted since its last step, first in the row.
            accepted_lens: [B]: how many (clamped to [0, K + 1]; 0: the row appends and drafts nothing).
            tokens_out: [B, K], written: row ``b``'s draft in ``tokens_out[b, :lengths_out[b]]``, -1 after.
            lengths_out: [B], written: each row's draft length (0: none).
            sources_out: [B], written: ``saspec.policy.NONE`` (0) or ``AUTOMATON`` (1).
            match_out: [B], written: each row's match length (0 where it appended nothing, takes no part or
                outgrew its slot).

        Raises:
            TypeError, ValueError: an argument of another type, dtype, device or shape, or an output that
                overlaps another argument (nothing is enqueued).
            RuntimeError: no batch is prepared (or a request of it finished), or the drafter is closed.
        """
        self._check_open()
        if self._batch is None:
            raise RuntimeError("no batch is prepared (or a request in it finished): call prepare() first")
        dev = self._dev
        k = self.k
        args = (accepted, accepted_lens, tokens_out, lengths_out, sources_out, match_out)
        names = ("accepted", "accepted_lens", "tokens_out", "lengths_out", "sources_out", "match_out")
        checked = [dev.check(x, name, 2 if name in ("accepted", "tokens_out") else 1, writable=name.endswith("_out"))
                   for x, name in zip(args, names)]
        b = int(checked[0].shape[0])
        shapes = ((b, k + 1), (b,), (b, k), (b,), (b,), (b,))
        for x, name, shape in zip(checked, names, shapes):
            if tuple(x.shape) != shape:
                raise ValueError(f"{name} must have shape {shape} for {b} rows and K={k}, got {tuple(x.shape)}")
        if b > self.max_slots:
            raise ValueError(f"at most max_slots={self.max_slots} rows, got {b}")
        if b < len(self._batch):
            raise ValueError(f"the step needs at least the prepared batch's {len(self._batch)} rows, got {b}")
        spans = [array_span(x) for x in checked]
        for i in range(2, 6):
            for j, other in enumerate(spans):
                if j != i and spans[i] is not None and other is not None and spans[i][0] < other[1] \
                        and other[0] < spans[i][1]:
                    raise ValueError(f"{names[i]} overlaps {names[j]}")
        if b == 0:
            return
        if self._timing is not None:
            if self._same:
                self.policy.observe_step(*self._timing)
            self._timing = None
        rows = self._rows_of.get(b)
        if rows is None:
            bf = self._bufs
            rows = self._rows_of[b] = tuple(bf[n][:b] for n in ("match", "draft", "branch", "lens", "offered",
                                                                 "row_slots"))
        match, draft, branch, lens, offered, row_slots = rows
        self.engine.extend(checked[0], checked[1], match, draft, None, branch)
        threads = _THREADS if not dev.simulated else min(b, 8)  # the simulator runs a Python thread per thread
        grid = (b + threads - 1) // threads
        view = (lambda x: x) if dev.simulated else dev.view
        sl = self._slots
        dev.launch(offers_kernel, grid, threads, view(sl.rows), view(sl.slots), view(self._bufs["caps"]),
                   view(checked[1]), view(match), view(draft), view(branch), np.int32(self.min_match), np.int32(k),
                   np.int32(sl.layout.cap_tok), view(lens), view(offered), view(row_slots))
        self.policy.step(match, offered, branch, draft, checked[0], lens, row_slots, checked[3], checked[4])
        dev.launch(cut_kernel, grid, threads, view(draft), view(checked[3]), view(checked[4]), view(match),
                   view(checked[2]), view(checked[5]))
        self._same = True
