"""The automaton's CUDA kernels: one decode step over the device slots, and the upload into them.

Kernels (``numba.cuda.jit``, over the same ``core`` functions as the host loops
in ``saspec.extend``), launched by ``slots.DeviceSlots``:

* ``extend_kernel``: the per-decode-step call. One thread per batch row
  appends the row's accepted tokens to its slot with ``core.extend_fixed``,
  then writes ``core.match_len`` and ``core.draft``. It is safe for any input
  values (it never writes out of bounds) because the GPU path validates only
  what the host sees without a sync (dtype, shape, device, contiguity):

  - ``accepted_lens[b]`` is clamped to ``[0, accepted.shape[1]]``;
  - a negative token stops the row: the tokens before it are appended, the
    rest are dropped, and the row reports match 0 and drafts -1 for the step;
  - rows at or beyond the prepared batch size (read on the device, so a
    captured CUDA graph follows later ``prepare`` calls) append nothing and
    report match 0 and drafts -1. A graph replays the B rows it was captured
    with: prepare at most B requests before replaying it;
  - a slot that reaches its capacity stops growing and reports match 0 from
    then on (``core.extend_fixed``).

* ``unpack_kernel`` and ``link_kernel``: rebuild uploaded automata in their
  slots (see ``slots``). ``unpack_kernel`` clears a reused slot's edge table
  and copies the header, text and states; ``link_kernel`` then inserts every
  table edge in parallel, claiming a table slot with ``atomic.cas`` on its SRC
  word (open addressing with the probe sequence of ``core.find_slot``) and
  chaining it to its state with ``atomic.exch`` on the state's MORE word.
  (First edges travel inside the state records.) The upload's layout (its
  descriptors and edge records) is defined here, beside the kernels that read it.

Importing this module imports ``numba.cuda`` (numba-cuda); ``saspec`` imports
it only for ``SpecEngine(backend="cuda")``.
"""

from __future__ import annotations

from numba import cuda, int32, int64

from .. import core
from . import runtime  # noqa: F401  (first: saspec's cache locator for the kernels below)

# Upload descriptors, one per uploaded request, at the start of the device
# staging buffer: DESC_WORDS int32 words each.
D_SLOT = 0  # destination slot
D_OFFSET = 1  # payload offset in the staging buffer (words)
D_EDGES = 2  # edges in the payload
D_CLEAR = 3  # 1: the slot was used before, clear its edge table first
DESC_WORDS = 4
EDGE_WORDS = 3  # payload edge records: (SRC, TOK, DST)

# Kernel signatures as launched (``slots.DeviceSlots``); ``tests/library/test_ptx.py``
# compiles each kernel to PTX with these.
_ARR1 = int32[::1]
_ARR2 = int32[:, ::1]
SIGNATURES: dict[str, tuple] = {
    "extend_kernel": (_ARR2, _ARR1, _ARR2, _ARR1, _ARR1, _ARR2, int32, int32, _ARR1, _ARR2, _ARR1, _ARR1, _ARR1),
    "unpack_kernel": (_ARR2, _ARR1, int32, int32, int32, int32, int32, int32, _ARR2),
    "link_kernel": (_ARR2, _ARR1, int32, int32, int32, int32, int32, int32),
}


@cuda.jit(device=True)
def _no_draft(match_out, out, b, k, source_out, branch_out):
    match_out[b] = 0
    for j in range(k):
        out[j] = -1
    if b < source_out.shape[0]:
        source_out[b] = 0
    if b < branch_out.shape[0]:
        branch_out[b] = 0


@cuda.jit(device=True)
def _pool_row(buf, accepted, b, n, slot, match_out, out, k, source_out, branch_out, pool_automaton, pstate, pctl):
    """The cross-request pool's side of row ``b`` (``saspec.extend.pool_rows`` on the host):
    follow its new tokens in the pool (re-matching its last ``pctl[2]`` tokens when
    its state belongs to another pool epoch than ``pctl[1]``), and draft from the pool
    where its match there is strictly longer than its own."""
    if pstate[2, slot] != pctl[1]:
        text = buf[core.H_O_TEXT]
        nt = buf[core.H_N]
        s = int64(0)
        m = int64(0)
        for i in range(max(0, nt - pctl[2]), nt):
            t = int64(buf[text + i])
            s, m = (int64(0), int64(0)) if t == core.SEPARATOR else core.follow(pool_automaton, s, m, t)
        pstate[2, slot] = pctl[1]
    else:
        s = int64(pstate[0, slot])
        m = int64(pstate[1, slot])
        for j in range(n):
            t = int64(accepted[b, j])  # the separator's id breaks the match (as on the host)
            s, m = (int64(0), int64(0)) if t == core.SEPARATOR else core.follow(pool_automaton, s, m, t)
    pstate[0, slot] = s
    pstate[1, slot] = m
    src = 0
    if m > match_out[b]:
        start = core.continuation(pool_automaton, s, core.SEPARATOR)
        if start >= 0:
            core.draft_from(pool_automaton, start, out, k, core.SEPARATOR)
            match_out[b] = m
            src = 1
            if b < branch_out.shape[0]:
                branch_out[b] = core.state_branches(pool_automaton, s)
    if b < source_out.shape[0]:
        source_out[b] = src


@cuda.jit(cache=True)
def extend_kernel(slots, rows, accepted, lens, match_out, draft_out, occurrence, depth, pool_automaton, pstate, pctl,
                  source_out, branch_out):
    """One decode step; thread ``b`` handles batch row ``b``.

    slots: int32 [max_slots, words], one automaton per slot. rows: int32
    [1 + max_slots], ``rows[0]`` the prepared batch size, ``rows[1 + b]`` row
    b's slot. accepted: int32 [B, K+1]; lens: int32 [B]; match_out: int32 [B];
    draft_out: int32 [B, K]. The cross-request pool (used where ``pctl[0]`` is
    1): pool_automaton, its automaton; pstate: int32 [3, max_slots], each slot's
    state, match length and epoch there; pctl: int32 [3], (in use, epoch, sync tokens);
    source_out: int32 [>= 1], 1 where row b drafted from the pool (written for
    the rows it has room for); branch_out: int32 [>= 1], likewise, 1 where row
    b's match went on with several tokens earlier (``core.branched``).
    """
    b = cuda.grid(1)
    nb = min(accepted.shape[0], lens.shape[0], match_out.shape[0], draft_out.shape[0])
    if b >= nb:
        return
    k = draft_out.shape[1]
    out = draft_out[b]
    slot = -1
    if b < rows[0] and b + 1 < rows.shape[0]:
        slot = rows[1 + b]
    if slot < 0 or slot >= slots.shape[0]:
        _no_draft(match_out, out, b, k, source_out, branch_out)
        return
    buf = slots[slot]
    n = min(max(lens[b], 0), accepted.shape[1])
    for j in range(n):
        token = accepted[b, j]
        if token < 0:
            _no_draft(match_out, out, b, k, source_out, branch_out)
            return
        # int64: the simulator runs the core on numpy scalars, where an int32
        # token would overflow the hash (compiled code widens anyway).
        core.extend_fixed(buf, int64(token), occurrence, depth)
    match_out[b] = core.match_len(buf)
    core.draft(buf, out, k)
    if b < branch_out.shape[0]:
        branch_out[b] = core.branched(buf)
    if pctl[0] != 0 and slot < pstate.shape[1]:
        _pool_row(buf, accepted, b, n, slot, match_out, out, k, source_out, branch_out, pool_automaton, pstate,
                  pctl)


@cuda.jit(cache=True)
def unpack_kernel(slots, stage, n_req, o_states, o_aux, o_slots, o_text, ht_size, pstate):
    """Copy each uploaded request's header, text, hot and cold state records
    into its slot, clearing the slot's edge table first when ``D_CLEAR`` is set,
    and mark its cross-request pool state stale (``pstate[2, slot] = -1``).

    Grid: x strides over a request's words, y over the requests. stage:
    int32, ``n_req`` descriptors then the payloads (see ``slots.pack``).
    """
    x0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    xs = cuda.gridDim.x * cuda.blockDim.x
    for r in range(cuda.blockIdx.y, n_req, cuda.gridDim.y):
        d = DESC_WORDS * r
        buf = slots[stage[d + D_SLOT]]
        if x0 == 0:
            pstate[2, stage[d + D_SLOT]] = -1
        off = stage[d + D_OFFSET]
        n_clear = ht_size if stage[d + D_CLEAR] != 0 else 0
        head = core.HEADER + stage[off + core.H_N]  # header, then text
        n_hot = core.STATE_WORDS * stage[off + core.H_NSTATES]
        n_st = (core.STATE_WORDS + core.AUX_WORDS) * stage[off + core.H_NSTATES]
        for i in range(x0, n_clear + head + n_st, xs):
            if i < n_clear:
                buf[o_slots + core.SLOT_WORDS * i + core.SRC] = -1
            elif i < n_clear + core.HEADER:
                j = i - n_clear
                buf[j] = stage[off + j]
            elif i < n_clear + head:
                j = i - n_clear
                buf[o_text + j - core.HEADER] = stage[off + j]
            else:
                j = i - n_clear - head
                if j < n_hot:
                    buf[o_states + j] = stage[off + head + j]
                else:
                    buf[o_aux + j - n_hot] = stage[off + head + j]


@cuda.jit(cache=True)
def link_kernel(slots, stage, n_req, o_states, o_aux, o_slots, o_text, ht_size):
    """Insert each uploaded request's table edges into its slot's table and chains.

    Runs after ``unpack_kernel`` (the table is clear, every MORE is -1). One
    thread per edge; the edges of an automaton are distinct (SRC, TOK) pairs,
    so a claimed slot never needs its TOK compared.
    """
    x0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    xs = cuda.gridDim.x * cuda.blockDim.x
    for r in range(cuda.blockIdx.y, n_req, cuda.gridDim.y):
        d = DESC_WORDS * r
        buf = slots[stage[d + D_SLOT]]
        off = stage[d + D_OFFSET]
        n_st = (core.STATE_WORDS + core.AUX_WORDS) * stage[off + core.H_NSTATES]
        edges = off + core.HEADER + stage[off + core.H_N] + n_st
        for e in range(x0, stage[d + D_EDGES], xs):
            w = edges + EDGE_WORDS * e
            src = stage[w]
            token = stage[w + 1]
            # core.find_slot's probe sequence, claiming the first empty slot.
            i = core.probe_start(int64(src), int64(token), ht_size)
            while cuda.atomic.cas(buf, o_slots + core.SLOT_WORDS * i + core.SRC, -1, src) != -1:
                i = core.probe_next(i, ht_size)
            s = o_slots + core.SLOT_WORDS * i
            buf[s + core.S_TOK] = token
            buf[s + core.S_DST] = stage[w + 2]
            more = o_aux + core.AUX_WORDS * src + core.MORE
            buf[s + core.NEXT] = cuda.atomic.exch(buf, more, int32(i))


KERNELS = {"extend_kernel": extend_kernel, "unpack_kernel": unpack_kernel, "link_kernel": link_kernel}
