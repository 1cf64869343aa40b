"""The CUDA kernels of the device drafting step (``drafter.DeviceDrafter.step``), around the automaton's
``extend_kernel`` and the policy's ``decide_kernel``:

* ``offers_kernel`` (after ``extend``): each row's offer as the host's ``Drafter`` makes it (its match below
  ``min_match``: none; else its draft's real tokens, cut to K, to its request's cap and to the room left in
  its slot), the row's slot from the engine's device row map, and the rows that take no part zeroed;
* ``cut_kernel`` (after ``decide``): each row's draft cut to the length the policy chose, -1 after.

Importing this module imports ``numba.cuda`` (numba-cuda).
"""

from __future__ import annotations

from numba import cuda, int32

from .. import core
from ..options import HINT_SEPARATOR
from . import runtime  # noqa: F401  (first: saspec's cache locator for the kernels below)


@cuda.jit(cache=True)
def offers_kernel(rows, slots, caps, lens, match, draft, branch, min_match, k, cap_tok, lens_eff, offered, row_slots):
    """Each row's offer; thread ``b`` handles row ``b`` of ``B = match.shape[0]``.

    rows: the engine's row map (int32 [1 + max_slots]: the prepared batch size, then each row's slot);
    slots: its automata (int32 [max_slots, words]); caps: int32 [>= B], each prepared row's cap (-1: the
    row takes no part; else at most ``k``); lens: int32 [B], the tokens each row appended; match, draft
    [B, k], branch: ``extend``'s outputs. Written: lens_eff [B] (``lens`` clamped to [0, k + 1], 0 where
    the row takes no part), match [B] (0 there), offered [B], row_slots [B] (-1 past the prepared batch),
    branch [B] (0 where no part).
    """
    b = cuda.grid(1)
    if b >= match.shape[0]:
        return
    slot = -1
    if b < rows[0] and b + 1 < rows.shape[0]:
        slot = rows[1 + b]
        if slot < 0 or slot >= slots.shape[0]:
            slot = -1
    cap = caps[b] if slot >= 0 and b < caps.shape[0] else -1
    n = min(max(lens[b], 0), k + 1)
    row_slots[b] = slot
    if cap < 0 or n == 0:
        lens_eff[b] = 0 if cap < 0 else n
        match[b] = 0
        offered[b] = 0
        branch[b] = 0
        return
    lens_eff[b] = n
    m = match[b]
    count = 0
    if m >= min_match:
        limit = min(cap, draft.shape[1], cap_tok - slots[slot, core.H_N])
        while count < limit and 0 <= draft[b, count] < HINT_SEPARATOR:
            count += 1
    offered[b] = count


@cuda.jit(cache=True)
def cut_kernel(draft, lengths, sources, match, tokens_out, match_out):
    """Row ``b``'s draft (``draft[b]``) into ``tokens_out[b]`` up to its length where its source is the
    automaton (1), -1 after and elsewhere; its match into ``match_out[b]``. int32: draft [B, >= K],
    lengths, sources, match [B]; tokens_out [B, K], match_out [B]."""
    b = cuda.grid(1)
    if b >= tokens_out.shape[0]:
        return
    match_out[b] = match[b]
    n = lengths[b] if sources[b] == 1 else 0
    n = min(max(n, 0), tokens_out.shape[1])
    for j in range(n):
        tokens_out[b, j] = draft[b, j]
    for j in range(n, tokens_out.shape[1]):
        tokens_out[b, j] = -1


KERNELS = {"offers_kernel": offers_kernel, "cut_kernel": cut_kernel}

_I1, _I2 = int32[::1], int32[:, ::1]
#: The kernels' signatures as launched (``tests/library/test_ptx.py`` compiles them to PTX).
SIGNATURES: dict[str, tuple] = {
    "offers_kernel": (_I1, _I2, _I1, _I1, _I1, _I2, _I1, int32, int32, int32, _I1, _I1, _I1),
    "cut_kernel": (_I2, _I1, _I1, _I1, _I2, _I1),
}
