"""The CUDA backend of ``SpecEngine``: requests built on the host, then resident in device slots.

``add_request`` builds a request into a host slot (``host.HostSlots``, no
headroom: the device slot, not the host blob, holds the decoded tokens);
``prepare`` uploads the batch's new requests into ``slots.DeviceSlots``,
after which the device copy is the only one (the host slot keeps an empty blob
until ``remove_request``); ``extend`` is one kernel launch on torch's current
stream with no host sync. Called under the engine's lock, like the host backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from .. import core
from ..arena import blob_bytes
from ..host import EMPTY_BLOB, HostSlots, SABlobs
from ..validate import BRANCH_PAIRS, SOURCE_PAIRS, check_no_overlap
from .slots import DeviceSlots


class DeviceBackend:
    """``SpecEngine``'s CUDA backend.

    Args:
        kind: the blobs' kind (``host.SABlobs``), which builds on the host.
        max_slots, max_seq_len, device: see ``SpecEngine``.
        pool_words: device words reserved for a cross-request pool's automaton (0: none).
    """

    device = True

    def __init__(self, kind: SABlobs, max_slots: int, max_seq_len: int, device: Any = None,
                 pool_words: int = 0) -> None:
        self.kind = kind
        self.host = HostSlots()  # requests built and not uploaded yet
        self.slots = DeviceSlots(max_slots, max_seq_len, kind.occurrence, kind.depth, device, pool_words)
        self._warned_overflow: set[Hashable] = set()

    # -- requests ----------------------------------------------------------------------

    def check_prompt(self, n_tokens: int) -> None:
        """Raise ``ValueError`` for a prompt longer than a device slot holds."""
        if n_tokens > self.slots.layout.max_seq_len:
            raise ValueError(
                f"prompt has {n_tokens} tokens, more than max_seq_len={self.slots.layout.max_seq_len} "
                "(the capacity of a device slot)"
            )

    def build(self, tokens: np.ndarray, headroom: int | None) -> np.ndarray:
        return self.kind.build(tokens, None, self.host.arena)  # the device slot holds the decoded tokens

    def install(self, blob: np.ndarray, prompt_len: int, expected_tokens: int = 0) -> int:
        return self.host.take(blob, prompt_len)

    def text(self, request_id: Hashable, slot: int) -> np.ndarray:
        """A copy of a request's whole text (synchronizes for a resident one)."""
        if request_id in self.slots.slot_of:
            return self.slots.text(request_id)
        return self.kind.text(self.host.blobs[slot])

    def prompt_len(self, slot: int) -> int:
        return int(self.host.prompt_len[slot])

    def release(self, request_id: Hashable, slot: int) -> None:
        self.host.free(slot)
        self._warned_overflow.discard(request_id)
        self.slots.release(request_id)

    def prepare(self, ids: tuple[Hashable, ...], slots: Sequence[int], request_pool: Any = None) -> None:
        """Upload the batch's new requests and write the batch map; a newer pool reaches
        the device here, never inside ``extend``."""
        dev = self.slots
        new = {r: self.host.blobs[s] for r, s in zip(ids, slots) if r not in dev.slot_of}
        dev.prepare(ids, new)
        for r, s in zip(ids, slots):  # the device copy is authoritative from now on
            if r in new:
                self.host.put(s, EMPTY_BLOB)
        if request_pool is not None:
            blob, epoch, _ = request_pool.current
            # An empty pool stays off (as on the host): rows keep their pool state (never synced) until a text
            # is pooled, and then match it from their text; following an empty pool would keep their match at 0.
            if blob is not dev.uploaded_pool and int(blob[core.H_N]) > 0:
                dev.set_request_pool(blob, epoch, request_pool.sync_tokens)

    def extend(self, accepted: Any, accepted_lens: Any, match_len_out: Any, draft_out: Any, source_out: Any,
               request_pool: Any, batch: tuple[Hashable, ...], branch_out: Any = None) -> None:
        arrays = (accepted, accepted_lens, match_len_out, draft_out, source_out, branch_out)
        check_no_overlap(arrays)
        if source_out is not None:
            check_no_overlap(arrays, SOURCE_PAIRS)
        if branch_out is not None:
            check_no_overlap(arrays, BRANCH_PAIRS)
        self.slots.extend(accepted, accepted_lens, match_len_out, draft_out, len(batch), source_out, branch_out)

    # -- inspection (these synchronize) --------------------------------------------------

    def tokens(self, request_id: Hashable, slot: int) -> int:
        if request_id in self.slots.slot_of:
            return self.slots.tokens([request_id])[0]
        return self.kind.tokens(self.host.blobs[slot])

    def overflowed(self, request_id: Hashable, slot: int) -> bool:
        if request_id not in self.slots.slot_of:
            return False
        return bool(self._overflow_check([request_id]))

    def _overflow_check(self, resident: list[Hashable]) -> int:
        """How many of ``resident`` overflowed; warns for the ones not warned about yet."""
        flags = self.slots.overflowed(resident)
        for r, f in zip(resident, flags):
            if f and r not in self._warned_overflow:
                self._warned_overflow.add(r)
                warnings.warn(
                    f"saspec: request {r!r} outgrew max_seq_len={self.slots.layout.max_seq_len} and no longer "
                    "drafts (match 0); raise max_seq_len or remove it",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return sum(flags)

    def stats(self, slot_of: dict[Hashable, int]) -> dict[str, int]:
        dev = self.slots
        resident = [r for r in slot_of if r in dev.slot_of]
        host = [self.host.blobs[s] for r, s in slot_of.items() if r not in dev.slot_of]
        return {
            "requests": len(slot_of),
            "overflowed": self._overflow_check(resident),
            "tokens": sum(dev.tokens(resident)) + sum(self.kind.tokens(b) for b in host),
            "bytes": sum(blob_bytes(b) for b in host),
            "device_bytes": dev.device_bytes,
            "device_bytes_per_slot": dev.layout.nbytes,
            "max_slots": dev.max_slots,
            "free_slots": dev.free_slots,
            "max_seq_len": dev.layout.max_seq_len,
        }

    def blob_copies(self, slot_of: dict[Hashable, int]) -> dict[Hashable, np.ndarray]:
        dev = self.slots
        return {r: dev.blob(r) if r in dev.slot_of else self.host.blobs[s].copy() for r, s in slot_of.items()}

    def close(self) -> None:
        """Nothing to stop: device memory returns to torch's allocator with the slots."""
