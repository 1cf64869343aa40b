"""The device slots of the CUDA backend: the requests' automata resident on the GPU, and uploads into them.

A CUDA ``SpecEngine``'s backend (``backend.DeviceBackend``) owns a ``DeviceSlots``: ``max_slots`` fixed-capacity
automaton blobs in one int32 device tensor ``[max_slots, words]``, allocated at
construction from torch's caching allocator, plus the batch's row-to-slot map
``rows`` (int32 ``[1 + max_slots]``: the batch size, then each row's slot).

Slot capacity (``slot_layout``): an automaton of n tokens has at most 2n - 1
states and at most n edges in its table (every state but one keeps its first
edge in its record, and there are at most states - 1 + n edges), so a slot
with ``cap_tok = max_seq_len``, ``cap_st = 2 * max_seq_len + 1`` and an edge
table of ``ceil(4 * max_seq_len / 3)`` slots (3/4 load limit,
``core.max_used``) never runs out of room before ``max_seq_len`` tokens. That
is at most ``73.4 * max_seq_len + 99`` bytes per slot (``SlotLayout.nbytes``),
within ``100 * max_seq_len + 80``.

Upload. ``add_request`` builds a request on the host (``build``), in a blob
sized for that request. ``prepare`` gives each batch request that is not yet
on the device a free slot and uploads it. The device table has a different
size than the host's, so the host blob is not copied as is: ``pack`` writes
the header (with the device layout), the text, the hot and cold state records
(table-edge chains reset) and the occupied table edges compacted to
(SRC, TOK, DST) records into a pinned
staging buffer, O(request) words; one async copy sends them, and two kernels
(``automaton_kernels.unpack_kernel``, ``link_kernel``) rebuild the table and the
chains in the slot. After the upload the device copy is authoritative: the
host blob is dropped (it would be stale after the next step), and the request
stays resident until ``remove_request`` frees its slot. A slot that is reused
is cleared and the new request uploaded into it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from .. import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from .. import core
from . import automaton_kernels as kc
from .runtime import grid_blocks, new_device

# Slot words are indexed with int32 offsets on the device.
MAX_SLOT_WORDS = 2**31 - 1


@dataclass(frozen=True)
class SlotLayout:
    """Capacities of one device slot (a blob laid out by ``core.init``)."""

    max_seq_len: int
    cap_tok: int
    cap_st: int
    ht_size: int

    @property
    def words(self) -> int:
        """int32 words per slot."""
        return core.layout_words(self.cap_tok, self.cap_st, self.ht_size)

    @property
    def nbytes(self) -> int:
        """Device bytes per slot: at most ``73.4 * max_seq_len + 99``."""
        return 4 * self.words

    @property
    def offsets(self) -> tuple[int, int, int, int]:
        """Word offsets of the states, aux, slots and text regions."""
        return (core.HEADER, *core.region_offsets(self.cap_st, self.ht_size))


def slot_layout(max_seq_len: int) -> SlotLayout:
    """The smallest slot that holds any ``max_seq_len`` tokens without ``NO_ROOM``:
    2n+1 states and a table of ceil(4n/3) slots for at most n table edges at
    3/4 load."""
    n = int(max_seq_len)
    if n < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    layout = SlotLayout(n, n, 2 * n + 1, (4 * n + 2) // 3)
    if layout.words > MAX_SLOT_WORDS:
        raise ValueError(f"max_seq_len={n} needs {layout.words} words per slot, more than 2**31 - 1")
    return layout


def payload_words(blob: np.ndarray) -> int:
    """int32 words ``pack`` writes for ``blob``: O(tokens + states + edges)."""
    n, ns, used = int(blob[core.H_N]), int(blob[core.H_NSTATES]), int(blob[core.H_USED])
    return core.HEADER + n + (core.STATE_WORDS + core.AUX_WORDS) * ns + kc.EDGE_WORDS * used


@njit(nogil=True, cache=True)
def pack(blob, out, start, cap_tok, cap_st, ht_size):
    """Write ``blob``'s upload payload to ``out[start:]``; return its end index.

    Payload (int32): the header for a slot with capacities (cap_tok, cap_st,
    ht_size) (region offsets as ``core.init`` lays them out), the text, the
    hot state records as they are, the cold records with MORE = -1, then one
    (SRC, TOK, DST) record per occupied slot of the host table. Returns -1,
    writing nothing, if the automaton does not fit those capacities.
    """
    n = blob[core.H_N]
    ns = blob[core.H_NSTATES]
    if n > cap_tok or ns > cap_st or blob[core.H_USED] > core.max_used(ht_size):
        return -1
    for i in range(core.HEADER):
        out[start + i] = blob[i]
    out[start + core.H_CAP_TOK] = cap_tok
    out[start + core.H_CAP_ST] = cap_st
    out[start + core.H_HT_SIZE] = ht_size
    o_aux, o_slots, o_text = core.region_offsets(cap_st, ht_size)
    out[start + core.H_O_STATES] = core.HEADER
    out[start + core.H_O_AUX] = o_aux
    out[start + core.H_O_SLOTS] = o_slots
    out[start + core.H_O_TEXT] = o_text
    p = start + core.HEADER
    text = blob[core.H_O_TEXT]
    for i in range(n):
        out[p + i] = blob[text + i]
    p += n
    states = blob[core.H_O_STATES]
    for i in range(core.STATE_WORDS * ns):
        out[p + i] = blob[states + i]
    p += core.STATE_WORDS * ns
    aux = blob[core.H_O_AUX]
    for i in range(core.AUX_WORDS * ns):
        out[p + i] = blob[aux + i]
    for s in range(ns):
        out[p + core.AUX_WORDS * s + core.MORE] = -1
    p += core.AUX_WORDS * ns
    slots = blob[core.H_O_SLOTS]
    for i in range(blob[core.H_HT_SIZE]):
        w = slots + core.SLOT_WORDS * i
        if blob[w + core.SRC] != -1:
            out[p] = blob[w + core.SRC]
            out[p + 1] = blob[w + core.S_TOK]
            out[p + 2] = blob[w + core.S_DST]
            p += kc.EDGE_WORDS
    return p


class DeviceSlots:
    """``max_slots`` device slots of ``max_seq_len`` tokens, and the batch map.

    Not thread-safe by itself: ``SpecEngine`` calls it under its lock.

    Args:
        max_slots: requests that can be resident on the device at once.
        max_seq_len: tokens a slot holds (prompt plus generated).
        occurrence, depth: the occurrence rule code and recency depth (``core``).
        device: the CUDA device (torch device, index or string); default:
            torch's current device. Ignored under the CUDA simulator.
        pool_words: device words reserved for a cross-request pool's automaton
            (``set_request_pool``); 0: no pool.
    """

    def __init__(self, max_slots: int, max_seq_len: int, occurrence: int, depth: int, device: Any = None,
                 pool_words: int = 0) -> None:
        if int(max_slots) < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self.layout = slot_layout(max_seq_len)
        self.max_slots = int(max_slots)
        self._occurrence = np.int32(occurrence)
        self._depth = np.int32(max(min(depth, 2**31 - 1), -1))
        self._dev = new_device(device)
        # All -1: every slot's edge table starts empty (SRC = -1).
        self.slots = self._dev.full((self.max_slots, self.layout.words), -1)
        self.rows = self._dev.full((1 + self.max_slots,), 0)
        # The cross-request pool: its automaton, each slot's (state, length, epoch) in it, and
        # (in use, epoch, sync tokens); source_out for callers that pass none (never read).
        self.pool_words = int(pool_words)
        self.pool_automaton = self._dev.full((max(self.pool_words, core.HEADER),), 0)
        self.pstate = self._dev.full((3, self.max_slots), -1)
        self.pctl = self._dev.full((3,), 0)
        self._no_source = self._dev.full((1,), 0)
        self._no_branch = self._dev.full((1,), 0)
        self.uploaded_pool: Any = None  # the host pool blob last uploaded
        self._free = list(range(self.max_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._used = [False] * self.max_slots  # slot held a request before: clear it on reuse
        self.slot_of: dict[Hashable, int] = {}
        self._mapped: tuple[Hashable, ...] | None = None  # the batch the device map holds

    @property
    def device(self) -> Any:
        return self._dev.device

    @property
    def simulated(self) -> bool:
        return self._dev.simulated

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def device_bytes(self) -> int:
        """Device bytes allocated at construction (slots, the batch map and the cross-request pool)."""
        return sum(self._dev.nbytes(x) for x in (self.slots, self.rows, self.pool_automaton, self.pstate, self.pctl))

    def release(self, request_id: Hashable) -> None:
        """Free a resident request's slot (no-op for a request not on the device)."""
        slot = self.slot_of.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
            if self._mapped is not None and request_id in self._mapped:
                self._mapped = None

    def prepare(self, ids: Sequence[Hashable], blobs: dict[Hashable, np.ndarray]) -> None:
        """Make ``ids`` the batch: upload ``blobs`` (the host automata of the ids
        not resident yet) into free slots and write the row-to-slot map.

        Async on torch's current stream. Raises ``RuntimeError``, changing
        nothing, when there are fewer free slots than new requests.
        """
        ids = tuple(ids)
        new = [r for r in ids if r not in self.slot_of]
        if set(new) != set(blobs):
            raise AssertionError("prepare: blobs must be exactly the batch's non-resident requests")
        if len(new) > len(self._free):
            raise RuntimeError(
                f"no free device slot: the batch needs {len(new)} new slot(s) but {len(self._free)} of "
                f"max_slots={self.max_slots} are free; remove finished requests first"
            )
        if not new and ids == self._mapped:
            return
        lay = self.layout
        for r in new:
            if int(blobs[r][core.H_N]) > lay.max_seq_len:  # add_request prevents this
                raise ValueError(f"request {r!r} has more than max_seq_len={lay.max_seq_len} tokens")
        slots = {r: self._free[-1 - i] for i, r in enumerate(new)}
        map_words = 1 + len(ids)
        desc_words = kc.DESC_WORDS * len(new)
        upload_words = desc_words + sum(payload_words(blobs[r]) for r in new)
        if upload_words > MAX_SLOT_WORDS:
            raise ValueError(f"one prepare() can upload at most 2**31 - 1 words, this one needs {upload_words}")

        stage = self._dev.staging(map_words + upload_words)
        host = stage.host
        host[0] = len(ids)
        for b, r in enumerate(ids):
            host[1 + b] = slots[r] if r in slots else self.slot_of[r]
        base = map_words  # the upload region: descriptors, then payloads
        end = desc_words
        work = edges = 0
        for u, r in enumerate(new):
            blob = blobs[r]
            d = base + kc.DESC_WORDS * u
            host[d + kc.D_SLOT] = slots[r]
            host[d + kc.D_OFFSET] = end
            host[d + kc.D_EDGES] = int(blob[core.H_USED])
            host[d + kc.D_CLEAR] = int(self._used[slots[r]])
            stop = pack(blob, host, base + end, lay.cap_tok, lay.cap_st, lay.ht_size)
            if stop < 0:
                raise ValueError(f"request {r!r} does not fit a device slot of max_seq_len={lay.max_seq_len}")
            clear = lay.ht_size if self._used[slots[r]] else 0
            st_words = (core.STATE_WORDS + core.AUX_WORDS) * int(blob[core.H_NSTATES])
            work = max(work, clear + core.HEADER + int(blob[core.H_N]) + st_words)
            edges = max(edges, int(blob[core.H_USED]))
            end = stop - base

        dev = self._dev
        dev.copy_from_stage(self.rows, 0, stage, 0, map_words)
        if new:
            dev.copy_from_stage(stage.device, 0, stage, base, upload_words)
            dst, buf = dev.view(self.slots), dev.view(stage.device)
            n_req, geo = np.int32(len(new)), tuple(np.int32(x) for x in (*lay.offsets, lay.ht_size))
            ys = min(len(new), 65535)
            th, mb = dev.upload_threads, dev.max_upload_blocks
            dev.launch(kc.unpack_kernel, (grid_blocks(work, th, mb), ys), th, dst, buf, n_req, *geo,
                       dev.view(self.pstate))
            dev.launch(kc.link_kernel, (grid_blocks(edges, th, mb), ys), th, dst, buf, n_req, *geo)
        stage.release()

        for r, slot in slots.items():
            self._free.remove(slot)
            self._used[slot] = True
            self.slot_of[r] = slot
        self._mapped = ids

    def set_request_pool(self, blob: np.ndarray, epoch: int, sync_tokens: int) -> None:
        """Upload a cross-request pool's automaton (a host blob) and its epoch, async on
        torch's current stream: kernels launched before read the old one, later ones
        this one. Raises ``ValueError`` if it does not fit ``pool_words``."""
        words = int(blob.shape[0])
        if words > self.pool_words:
            raise ValueError(f"the pool's automaton needs {words} words, more than the {self.pool_words} reserved")
        stage = self._dev.staging(words + 3)
        stage.host[:words] = blob
        stage.host[words: words + 3] = (1, epoch, sync_tokens)
        self._dev.copy_from_stage(self.pool_automaton, 0, stage, 0, words)
        self._dev.copy_from_stage(self.pctl, 0, stage, words, 3)
        stage.release()
        self.uploaded_pool = blob

    def extend(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any, batch_len: int,
               source_out: Any = None, branch_out: Any = None) -> None:
        """Validate the step's arrays (metadata only) and launch ``extend_kernel``.

        B = ``draft_out.shape[0]`` may exceed the prepared batch (``batch_len``):
        the extra rows append nothing and get match 0 and drafts -1.
        """
        dev = self._dev
        acc = dev.check(accepted, "accepted", 2)
        lens = dev.check(accepted_lens, "accepted_lens", 1)
        mout = dev.check(match_len_out, "match_len_out", 1, writable=True)
        dout = dev.check(draft_out, "draft_out", 2, writable=True)
        src = self._no_source if source_out is None else dev.check(source_out, "source_out", 1, writable=True)
        bout = self._no_branch if branch_out is None else dev.check(branch_out, "branch_out", 1, writable=True)
        b, k = dout.shape
        if source_out is not None and tuple(src.shape) != (b,):
            raise ValueError(f"source_out must have shape {(b,)} for batch {b}, got {tuple(src.shape)}")
        if branch_out is not None and tuple(bout.shape) != (b,):
            raise ValueError(f"branch_out must have shape {(b,)} for batch {b}, got {tuple(bout.shape)}")
        if b < batch_len:
            raise ValueError(f"draft_out must have at least {batch_len} rows for the prepared batch, got {b}")
        for name, arr, shape in (
            ("accepted", acc, (b, k + 1)),
            ("accepted_lens", lens, (b,)),
            ("match_len_out", mout, (b,)),
        ):
            if tuple(arr.shape) != shape:
                raise ValueError(f"{name} must have shape {shape} for batch {b} and K={k}, got {tuple(arr.shape)}")
        if b == 0:
            return
        th = dev.extend_threads
        dev.launch(
            kc.extend_kernel,
            (b + th - 1) // th,
            th,
            dev.view(self.slots),
            dev.view(self.rows),
            dev.view(acc),
            dev.view(lens),
            dev.view(mout),
            dev.view(dout),
            self._occurrence,
            self._depth,
            dev.view(self.pool_automaton),
            dev.view(self.pstate),
            dev.view(self.pctl),
            dev.view(src),
            dev.view(bout),
        )

    # -- inspection (these synchronize) ---------------------------------------

    def tokens(self, request_ids: Sequence[Hashable]) -> list[int]:
        """Tokens held by each resident request's slot."""
        if not request_ids:
            return []
        heads = self._dev.to_numpy(self.slots[[self.slot_of[r] for r in request_ids], core.H_N])
        return [int(t) for t in heads]

    def overflowed(self, request_ids: Sequence[Hashable]) -> list[bool]:
        """Whether each resident request's slot ran out of room (its
        ``core.H_OVERFLOW`` flag, set by the kernel)."""
        if not request_ids:
            return []
        flags = self._dev.to_numpy(self.slots[[self.slot_of[r] for r in request_ids], core.H_OVERFLOW])
        return [bool(f) for f in flags]

    def blob(self, request_id: Hashable) -> np.ndarray:
        """An int32 host copy of a resident request's slot."""
        return self._dev.to_numpy(self.slots[self.slot_of[request_id]])

    def text(self, request_id: Hashable) -> np.ndarray:
        """An int32 host copy of a resident request's tokens."""
        slot = self.slots[self.slot_of[request_id]]
        n = int(self._dev.to_numpy(slot[core.H_N: core.H_N + 1])[0])
        o = self.layout.offsets[3]
        return self._dev.to_numpy(slot[o: o + n])
