"""The write-once suffix-automaton core.

Every function here is a ``numba.extending.register_jitable`` function over one
flat ``int32`` array, the *blob*, that holds one request's whole automaton. The
same source compiles with ``numba.njit`` for the host (see ``build`` and
``extend``) and with ``numba.cuda.jit`` for the device (see ``device.extend``), so
only scalar loops and array indexing are used here: no Python objects, no
allocation, no exceptions.

Blob layout (all int32; capacities are fixed for a given blob, the host grows a
request by copying it into a larger blob, see ``build.grow``)::

    [0, HEADER)           header words, the H_* indices below
    text   [cap_tok]      the tokens, 0 <= t < 2**31
    states [4 * cap_st]   one record per state: (LEN, LINK, POS, FIRST)
    slots  [4 * ht_size]  the edge hash table, one record per slot: (SRC, TOK, DST, NEXT)

The three regions are flat arrays. States and slots are 4-word records rather
than four parallel arrays because every access to them is random: one record is
one cache line on the host and one memory transaction on the GPU, which made
ingestion of large prompts about 1.5x faster than parallel arrays.

The edge table is open addressing with linear probing keyed by (SRC, TOK); a
slot's SRC is -1 while it is empty. Slots are never deleted, so a slot index is
stable and doubles as a node of the state's edge chain (FIRST, NEXT) that
cloning walks to copy a state's edges.

Matching. After each appended token the longest suffix of the text that also
ends earlier is the state ``link[last]``, and its length is ``length[link[last]]``
(the suffix link of the whole text is, by construction, its longest suffix with
another end position). ``extend`` records that length and the position where
the chosen earlier occurrence's continuation starts in the header, so ``match``
and ``draft`` are O(1) and O(k).

Occurrence policies (``policy`` argument):

* ``FIRST_OCC``: the earliest occurrence (POS is the first end position, fixed
  when the state is created). This is the classic ``firstpos`` and what sa_spec
  uses.
* ``RECENT``: the most recent earlier occurrence. Each new end position is
  written to the states on the suffix-link path, bounded to ``depth`` states
  (``depth < 0``: unbounded, exact). States deeper than ``depth`` keep an older,
  still real, end position, so the match length stays exact and the draft is
  still the continuation of a true earlier occurrence; only its recency is
  approximate. Cost per token: O(depth).
* ``NEAR_FIRST`` / ``NEAR_RECENT``: prefer the occurrence at or near the copy
  source the previous drafts came from (the *anchor*), else the base policy.
  Merely following the previous occurrence while it continues changes nothing
  (the earliest or latest occurrence of a suffix stays the earliest or latest
  when both grow by the same token); what helps is re-finding the source after
  an edit: the anchor keeps advancing through unmatched tokens, and positions
  within ``NEAR_WINDOW`` of it are checked for the new suffix. Every candidate
  is verified, so the draft is still a real occurrence of the longest match.

Capacity. ``extend`` first checks, without writing anything, that the token fits
(one text word, two states, the new edges within the table's load limit). If
not, it returns ``NO_ROOM`` and the blob is unchanged: the host grows the blob
and retries; a fixed-size device slot sets ``H_OVERFLOW`` instead, stops growing
and reports match length 0 from then on.
"""

from __future__ import annotations

from numba.extending import register_jitable

# Header word indices.
H_N = 0  # tokens in the text
H_NSTATES = 1  # states in use (state 0 is the root)
H_LAST = 2  # state of the whole text
H_USED = 3  # occupied edge slots
H_CAP_TOK = 4
H_CAP_ST = 5
H_HT_SIZE = 6  # edge slots
H_MATCH_LEN = 7  # longest suffix that also ends earlier, in tokens
H_MATCH_POS = 8  # where that occurrence's continuation starts; -1 if none
H_OVERFLOW = 9  # 1 once a fixed-capacity blob ran out of room
H_O_TEXT = 10  # word offsets of the regions
H_O_STATES = 11
H_O_SLOTS = 12
H_ANCHOR = 13  # NEAR_* policies: where the copy source is expected to continue; -1 if none
HEADER = 16  # words 14-15 are reserved

STATE_WORDS = 4
LEN = 0  # length of the state's longest string
LINK = 1  # suffix link, -1 for the root
POS = 2  # end position of the chosen occurrence
FIRST = 3  # first slot of the state's edge chain, -1 if none
SLOT_WORDS = 4
SRC = 0  # -1 while the slot is empty
TOK = 1
DST = 2
NEXT = 3  # next slot in SRC's chain, -1 at the end

# Occurrence policies.
FIRST_OCC = 0
RECENT = 1
NEAR_FIRST = 2
NEAR_RECENT = 3
NEAR_WINDOW = 8  # NEAR_*: how far from the anchor, in tokens, to look for the suffix
NEAR_MAX_CHECK = 32  # NEAR_*: longest match verified token by token near the anchor

# extend() results.
NO_ROOM = 0
APPENDED = 1
OVERFLOWED = 2


@register_jitable
def layout_words(cap_tok, cap_st, ht_size):
    """Total int32 words of a blob with these capacities."""
    return HEADER + cap_tok + STATE_WORDS * cap_st + SLOT_WORDS * ht_size


@register_jitable
def max_used(ht_size):
    """Most slots the table may hold: a 3/4 load limit keeps probes short and
    always leaves an empty slot, which ends every probe."""
    return (3 * ht_size) // 4


@register_jitable
def init(buf, cap_tok, cap_st, ht_size):
    """Lay out an empty automaton (root state only) in ``buf``.

    ``buf`` must hold at least ``layout_words(cap_tok, cap_st, ht_size)`` words,
    with ``cap_st >= 1`` and ``ht_size >= 4``.
    """
    for i in range(HEADER):
        buf[i] = 0
    buf[H_CAP_TOK] = cap_tok
    buf[H_CAP_ST] = cap_st
    buf[H_HT_SIZE] = ht_size
    buf[H_NSTATES] = 1
    buf[H_MATCH_POS] = -1
    buf[H_ANCHOR] = -1
    buf[H_O_TEXT] = HEADER
    buf[H_O_STATES] = HEADER + cap_tok
    buf[H_O_SLOTS] = HEADER + cap_tok + STATE_WORDS * cap_st
    root = buf[H_O_STATES]
    buf[root + LEN] = 0
    buf[root + LINK] = -1
    buf[root + POS] = -1
    buf[root + FIRST] = -1
    slots = buf[H_O_SLOTS]
    for i in range(ht_size):
        buf[slots + SLOT_WORDS * i + SRC] = -1


@register_jitable
def _hash(src, token):
    """32-bit mix of (src, token)."""
    h = (src * 0x2545F491 + token * 0x9E3779B1) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    return h ^ (h >> 16)


@register_jitable
def find_slot(buf, src, token):
    """Word offset of the slot holding edge (src, token), or of the empty slot
    where it would be inserted. Terminates because the table is never full."""
    size = buf[H_HT_SIZE]
    slots = buf[H_O_SLOTS]
    i = probe_start(src, token, size)
    while True:
        w = slots + SLOT_WORDS * i
        s = buf[w + SRC]
        if s == -1 or (s == src and buf[w + TOK] == token):
            return w
        i = probe_next(i, size)


@register_jitable
def probe_start(src, token, size):
    """First slot probed for edge (src, token) in a table of ``size`` slots."""
    return (_hash(src, token) * size) >> 32  # maps the hash onto [0, size) without a division


@register_jitable
def probe_next(i, size):
    """The slot probed after ``i``: linear probing, wrapping around."""
    i += 1
    return 0 if i == size else i


@register_jitable
def state(buf, s):
    """Word offset of state ``s``'s record."""
    return buf[H_O_STATES] + STATE_WORDS * s


@register_jitable
def transition(buf, src, token):
    """Target state of edge (src, token), or -1."""
    w = find_slot(buf, src, token)
    if buf[w + SRC] == -1:
        return -1
    return buf[w + DST]


@register_jitable
def _put(buf, w, src, token, dst):
    """Fill the empty slot at word offset ``w`` and chain it to ``src``."""
    rec = state(buf, src)
    buf[w + SRC] = src
    buf[w + TOK] = token
    buf[w + DST] = dst
    buf[w + NEXT] = buf[rec + FIRST]
    buf[rec + FIRST] = (w - buf[H_O_SLOTS]) // SLOT_WORDS
    buf[H_USED] += 1


@register_jitable
def _chain_len(buf, s):
    """Number of edges leaving state s."""
    slots = buf[H_O_SLOTS]
    count = 0
    i = buf[state(buf, s) + FIRST]
    while i != -1:
        count += 1
        i = buf[slots + SLOT_WORDS * i + NEXT]
    return count


@register_jitable
def extend(buf, token, policy, depth):
    """Append one token (online construction, O(1) amortized) and update the match.

    Returns ``APPENDED``; ``NO_ROOM`` (nothing written) when a capacity would be
    exceeded; ``OVERFLOWED`` when the blob already overflowed. ``token`` must be
    in [0, 2**31); callers validate.

    A read-only first pass walks the suffix-link path and counts the edges the
    token will add, so the capacity check happens before any write; the slots
    it found are reused by the second pass.
    """
    if buf[H_OVERFLOW] != 0:
        return OVERFLOWED
    n = buf[H_N]
    ns = buf[H_NSTATES]
    if n >= buf[H_CAP_TOK] or ns + 2 > buf[H_CAP_ST]:
        return NO_ROOM
    last = buf[H_LAST]

    # Pass 1 (read only): states on the path from `last` that lack a `token`
    # edge get one to the new state; the first that has one, p, decides the
    # link. Remember the first two empty slots found.
    k = 0
    w = 0
    w0 = -1
    w1 = -1
    p = last
    while p != -1:
        w = find_slot(buf, p, token)
        if buf[w + SRC] != -1:
            break
        if k == 0:
            w0 = w
        elif k == 1:
            w1 = w
        k += 1
        p = buf[state(buf, p) + LINK]
    q = -1
    clone = False
    need = k
    if p != -1:
        q = buf[w + DST]
        lq = buf[state(buf, q) + LEN]
        clone = buf[state(buf, p) + LEN] + 1 != lq
        if clone:
            # The clone copies q's edges as they are after the first loop below:
            # if q itself lies on the path it has gained the `token` edge by then.
            need += _chain_len(buf, q)
            r = last
            while r != p and buf[state(buf, r) + LEN] > lq:
                r = buf[state(buf, r) + LINK]
            if r == q:
                need += 1
    if buf[H_USED] + need > max_used(buf[H_HT_SIZE]):
        return NO_ROOM

    # Pass 2: write.
    buf[buf[H_O_TEXT] + n] = token
    cur = ns
    c = state(buf, cur)
    buf[c + LEN] = buf[state(buf, last) + LEN] + 1
    buf[c + POS] = n
    buf[c + FIRST] = -1
    ns += 1
    r = last
    for j in range(k):
        if j == 0:
            wj = w0
        elif j == 1 and w1 != w0:  # w1 is still empty unless it was w0
            wj = w1
        else:
            wj = find_slot(buf, r, token)
        _put(buf, wj, r, token, cur)
        r = buf[state(buf, r) + LINK]
    if p == -1:
        buf[c + LINK] = 0
    elif not clone:
        buf[c + LINK] = q
    else:
        qr = state(buf, q)
        cl = state(buf, ns)
        buf[cl + LEN] = buf[state(buf, p) + LEN] + 1
        buf[cl + LINK] = buf[qr + LINK]
        buf[cl + POS] = buf[qr + POS]
        buf[cl + FIRST] = -1
        slots = buf[H_O_SLOTS]
        i = buf[qr + FIRST]
        while i != -1:
            e = slots + SLOT_WORDS * i
            t = buf[e + TOK]
            _put(buf, find_slot(buf, ns, t), ns, t, buf[e + DST])
            i = buf[e + NEXT]
        buf[w + DST] = ns  # slot w, p's edge, has not moved: slots never do
        p = buf[state(buf, p) + LINK]
        while p != -1:
            w = find_slot(buf, p, token)
            if buf[w + SRC] == -1 or buf[w + DST] != q:
                break
            buf[w + DST] = ns
            p = buf[state(buf, p) + LINK]
        buf[qr + LINK] = ns
        buf[c + LINK] = ns
        ns += 1
    buf[H_NSTATES] = ns
    buf[H_LAST] = cur
    buf[H_N] = n + 1
    _update_match(buf, token, policy, depth)
    return APPENDED


@register_jitable
def extend_fixed(buf, token, policy, depth):
    """``extend`` for a blob that cannot grow (a device slot): when the token
    does not fit, mark the blob overflowed, so it stops growing and reports no
    match from then on."""
    r = extend(buf, token, policy, depth)
    if r == NO_ROOM:
        buf[H_OVERFLOW] = 1
        return OVERFLOWED
    return r


@register_jitable
def _ends_with_suffix(buf, e, m):
    """True when the m tokens ending at text position e equal the text's last m."""
    text = buf[H_O_TEXT]
    last = buf[H_N] - 1
    if e < m - 1 or e >= last:
        return False
    for j in range(m):
        if buf[text + e - j] != buf[text + last - j]:
            return False
    return True


@register_jitable
def _near(buf, token, m):
    """NEAR_* policies: an end position of the matched m-suffix at or near the
    anchor (the copy source's expected position), or -1.

    The anchor continues when its token is the new one and its agreement with
    the text covers the whole match; otherwise positions within NEAR_WINDOW of
    it are checked token by token (matches up to NEAR_MAX_CHECK long), nearest
    first. This re-finds the copy source after an edit (a replaced, inserted or
    deleted token), where the longest-suffix occurrence is often elsewhere.
    """
    anchor = buf[H_ANCHOR]
    if anchor < 0:
        return -1
    prev_m = buf[H_MATCH_LEN]
    if buf[buf[H_O_TEXT] + anchor] == token and (prev_m > 0 or m <= 1):
        return anchor  # the source continues: it agrees on prev_m + 1 >= m tokens
    if m > NEAR_MAX_CHECK:
        return -1
    for d in range(NEAR_WINDOW + 1):
        if _ends_with_suffix(buf, anchor + d, m):
            return anchor + d
        if d > 0 and _ends_with_suffix(buf, anchor - d, m):
            return anchor - d
    return -1


@register_jitable
def _update_match(buf, token, policy, depth):
    """Record the match for the text that just gained ``token`` at position n-1."""
    n = buf[H_N]
    s = buf[state(buf, buf[H_LAST]) + LINK]
    m = buf[state(buf, s) + LEN]
    start = -1
    if m > 0:
        e = -1
        if policy >= NEAR_FIRST:
            e = _near(buf, token, m)
        if e < 0:
            e = buf[state(buf, s) + POS]
        start = e + 1
    if policy >= NEAR_FIRST:
        # Without a match the copy source is assumed to advance in step.
        anchor = buf[H_ANCHOR]
        if start >= 0:
            buf[H_ANCHOR] = start
        elif anchor >= 0 and anchor + 1 < n:
            buf[H_ANCHOR] = anchor + 1
        else:
            buf[H_ANCHOR] = -1
    buf[H_MATCH_LEN] = m
    buf[H_MATCH_POS] = start
    if policy == RECENT or policy == NEAR_RECENT:
        # The states on the suffix-link path of the text are exactly those that
        # gain end position n-1; their old POS was read above.
        d = 0
        while s > 0 and d != depth:
            r = state(buf, s)
            buf[r + POS] = n - 1
            s = buf[r + LINK]
            d += 1


@register_jitable
def match_len(buf):
    """Length of the longest suffix of the text that also ends earlier (0 after overflow)."""
    if buf[H_OVERFLOW] != 0:
        return 0
    return buf[H_MATCH_LEN]


@register_jitable
def draft(buf, out, k):
    """Write up to ``k`` draft tokens into ``out[:k]`` and return how many are valid.

    The draft is the continuation of the chosen earlier occurrence of the
    matched suffix. Where that continuation runs into the current end of the
    text, it repeats with the period ``n - start`` (the text then predicts
    itself), so a match always yields ``k`` tokens. With no match (or after
    overflow) it returns 0. Entries of ``out[:k]`` past the returned count are -1.
    """
    start = buf[H_MATCH_POS]
    if buf[H_OVERFLOW] != 0 or buf[H_MATCH_LEN] == 0 or start < 0:
        for j in range(k):
            out[j] = -1
        return 0
    text = buf[H_O_TEXT]
    end = buf[H_N]
    i = start
    for j in range(k):
        out[j] = buf[text + i]
        i += 1
        if i == end:  # wrap: the period is end - start (no division)
            i = start
    return k


@register_jitable
def copy_into(src, dst):
    """Copy the automaton in ``src`` into the freshly ``init``-ed, larger ``dst``.

    A table of the same size is copied word for word; otherwise every edge is
    re-inserted (chain order is irrelevant to the automaton).
    """
    ns = src[H_NSTATES]
    for i in range(src[H_N]):
        dst[dst[H_O_TEXT] + i] = src[src[H_O_TEXT] + i]
    for i in range(STATE_WORDS * ns):
        dst[dst[H_O_STATES] + i] = src[src[H_O_STATES] + i]
    slots = src[H_O_SLOTS]
    if src[H_HT_SIZE] == dst[H_HT_SIZE]:
        for i in range(SLOT_WORDS * src[H_HT_SIZE]):
            dst[dst[H_O_SLOTS] + i] = src[slots + i]
        dst[H_USED] = src[H_USED]
    else:
        for s in range(ns):
            dst[state(dst, s) + FIRST] = -1
        for i in range(src[H_HT_SIZE]):
            w = slots + SLOT_WORDS * i
            if src[w + SRC] != -1:
                t = src[w + TOK]
                _put(dst, find_slot(dst, src[w + SRC], t), src[w + SRC], t, src[w + DST])
    for h in (H_N, H_NSTATES, H_LAST, H_MATCH_LEN, H_MATCH_POS, H_OVERFLOW, H_ANCHOR):
        dst[h] = src[h]
