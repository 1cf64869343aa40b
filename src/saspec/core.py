"""The write-once suffix-automaton core.

Every function here is a ``numba.extending.register_jitable`` function over one
flat ``int32`` array, the *blob*, that holds one request's whole automaton. The
same source compiles with ``numba.njit`` for the host (see ``build`` and
``extend``) and with ``numba.cuda.jit`` for the device (see ``device.automaton_kernels``), so
only scalar loops and array indexing are used here: no Python objects, no
allocation, no exceptions. (A few are ``host_inline``: the same function, also
inlined into its callers when compiled for the host.)

Blob layout (all int32; capacities are fixed for a given blob, the host grows a
request by copying it into a larger blob, see ``build.grow``)::

    [0, HEADER)           header words, the H_* indices below
    states [4 * cap_st]   hot record per state: (LEN, LINK, TOK, DST)
    aux    [2 * cap_st]   cold record per state: (POS, MORE)
    slots  [4 * ht_size]  the edge table for second and later edges: (SRC, TOK, DST, NEXT)
    text   [cap_tok]      the tokens, 0 <= t < 2**31

The hot records come first, at a fixed offset, so a record's place needs no
read of the header (``state``): the walks' dependent reads are one shorter.

Edges. Most states have one outgoing edge, so each state's *first* edge lives
in its hot record: TOK is its token and DST encodes its target and whether the
state has more edges. ``DST == 0``: no edge (state 0, the root, is never a
target, so 0 is free); ``DST > 0``: the only edge is TOK -> DST; ``DST < 0``: the
first edge is TOK -> -DST and the state's other edges are in the table. A
transition is therefore one read of the record, and only a state with two or
more edges whose first edge does not match probes the table. The pre-check and
the suffix-link walks read nothing but hot records unless a state branches.

The table is one open-addressing hash table with linear probing keyed by
(SRC, TOK); a slot's SRC is -1 while it is empty. Slots are never deleted, so a
slot index is stable and doubles as a node of the state's chain of table edges
(head MORE in the aux record, then NEXT; -1 ends it), which cloning walks to
copy a state's edges. An automaton of n tokens has at most n table edges:
every state but the one of the whole text has an inline first edge, and the
edges number at most states - 1 + n.

The hot record is 16 bytes (four to a 64-byte cache line on the host, two to a
32-byte sector on the GPU; the regions are not padded to align them: that
bought nothing); POS and MORE are read once per token and per clone, so
they live apart and do not dilute the records the walks touch.

Matching. After each appended token the longest suffix of the text that also
ends earlier is the state ``link[last]``, and its length is ``length[link[last]]``
(the suffix link of the whole text is, by construction, its longest suffix with
another end position). ``extend`` records that length and the position where
the chosen earlier occurrence's continuation starts in the header, so ``match``
and ``draft`` are O(1) and O(k). It also records whether the earlier
occurrences of the matched suffix all went on with the same token (the match
state has one outgoing edge) or with several (``branched``): a draft after a
branching match is one guess among several seen, and is accepted far less
often at the same match length, which the drafting policy uses.

Following another text. ``follow`` matches a text that is not appended to the
blob (a batch row's text against the shared pool of earlier requests, see
``pool``) one token at a time; ``continuation`` and ``draft_from`` then copy
what followed the chosen occurrence, up to a stop token.

Occurrence rules (``occurrence`` argument):

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
  source the previous drafts came from (the *anchor*), else the base rule.
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

Indexing. Every computed index into the blob goes through ``_ix``, which makes
it unsigned: numba wraps a negative signed index around from the end of the
array, a compare and a select on each access that sit on the critical path of
the walks' dependent reads. No index here is ever negative.
"""

from __future__ import annotations

import numpy as np
from numba.extending import overload, register_jitable


def host_inline(fn):
    """``register_jitable``, plus a CPU-target overload that numba inlines into
    its callers (IR inlining). On the host the calls of these few large
    functions cost about a quarter of an in-cache step; numba-cuda's IR inliner
    cannot handle them, so on the device they stay device-function calls."""
    register_jitable(fn)
    overload(fn, target="cpu", inline="always", strict=False)(lambda *args: fn)
    return fn


# Options for the host kernels that call the core (``build``, ``extend``): no
# reference counting (numba's NRT). They allocate nothing, and their arrays are
# the caller's or own nothing; with NRT, every inlined helper that takes the
# blob pays an incref and a decref call, whose clobbered registers push the
# walks' state to the stack (BENCHMARKS.md, "Host engine").
NO_NRT = {"_nrt": False}


@register_jitable
def _ix(i):
    """Index ``i >= 0`` as unsigned, so numba skips negative-index wraparound (see Indexing)."""
    return np.uint64(i)


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
H_O_STATES = 11  # always HEADER
H_O_SLOTS = 12
H_ANCHOR = 13  # NEAR_* rules: where the copy source is expected to continue; -1 if none
H_O_AUX = 14
H_BRANCHED = 15  # 1 where the matched suffix's earlier occurrences went on with more than one token
HEADER = 16

STATE_WORDS = 4  # hot record
LEN = 0  # length of the state's longest string
LINK = 1  # suffix link, -1 for the root
TOK = 2  # token of the first edge
DST = 3  # first edge's target: 0 none, > 0 the only edge, < 0 -target with more edges in the table
AUX_WORDS = 2  # cold record
POS = 0  # end position of the chosen occurrence
MORE = 1  # first slot of the chain of the state's table edges, -1 if none
SLOT_WORDS = 4
SRC = 0  # -1 while the slot is empty
S_TOK = 1
S_DST = 2
NEXT = 3  # next slot in SRC's chain, -1 at the end

# Occurrence rules.
FIRST_OCC = 0
RECENT = 1
NEAR_FIRST = 2
NEAR_RECENT = 3
NEAR_WINDOW = 8  # NEAR_*: how far from the anchor, in tokens, to look for the suffix
NEAR_MAX_CHECK = 32  # NEAR_*: longest match verified token by token near the anchor

# Ends each text in a pool automaton (``pool``): ``continuation`` and ``draft_from`` stop there.
# Token ids are below 2**31, so only a caller's id 2**31 - 1 could equal it (and would still draft real text).
SEPARATOR = 2**31 - 1

# extend() results.
NO_ROOM = 0
APPENDED = 1
OVERFLOWED = 2


@register_jitable
def layout_words(cap_tok, cap_st, ht_size):
    """Total int32 words of a blob with these capacities."""
    return HEADER + cap_tok + (STATE_WORDS + AUX_WORDS) * cap_st + SLOT_WORDS * ht_size


@register_jitable
def max_used(ht_size):
    """Most slots the table may hold: a 3/4 load limit keeps probes short and
    always leaves an empty slot, which ends every probe."""
    return (3 * ht_size) // 4


@register_jitable
def region_offsets(cap_st, ht_size):
    """Word offsets of the aux, slots and text regions (the states start at ``HEADER``)."""
    o_aux = HEADER + STATE_WORDS * cap_st
    o_slots = o_aux + AUX_WORDS * cap_st
    return o_aux, o_slots, o_slots + SLOT_WORDS * ht_size


@register_jitable
def init(buf, cap_tok, cap_st, ht_size):
    """Lay out an empty automaton (root state only) in ``buf``.

    ``buf`` must hold at least ``layout_words(cap_tok, cap_st, ht_size)`` words,
    with ``cap_st >= 1`` and ``ht_size >= 1``.
    """
    lay_out(buf, cap_tok, cap_st, ht_size)
    clear_table(buf)


@register_jitable
def lay_out(buf, cap_tok, cap_st, ht_size):
    """``init`` but for the table, which is left as it is."""
    for i in range(HEADER):
        buf[_ix(i)] = 0
    buf[H_CAP_TOK] = cap_tok
    buf[H_CAP_ST] = cap_st
    buf[H_HT_SIZE] = ht_size
    buf[H_NSTATES] = 1
    buf[H_MATCH_POS] = -1
    buf[H_ANCHOR] = -1
    o_aux, o_slots, o_text = region_offsets(cap_st, ht_size)
    buf[H_O_STATES] = HEADER
    buf[H_O_AUX] = o_aux
    buf[H_O_SLOTS] = o_slots
    buf[H_O_TEXT] = o_text
    root = buf[H_O_STATES]
    buf[_ix(root + LEN)] = 0
    buf[_ix(root + LINK)] = -1
    buf[_ix(root + TOK)] = 0
    buf[_ix(root + DST)] = 0
    a = buf[H_O_AUX]
    buf[_ix(a + POS)] = -1
    buf[_ix(a + MORE)] = -1


@register_jitable
def clear_table(buf):
    """Mark every table slot empty and the table unused."""
    slots = buf[H_O_SLOTS]
    for i in range(buf[H_HT_SIZE]):
        buf[_ix(slots + SLOT_WORDS * i + SRC)] = -1
    buf[H_USED] = 0


@register_jitable
def _hash(src, token):
    """32-bit mix of (src, token)."""
    h = (src * 0x2545F491 + token * 0x9E3779B1) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    return h ^ (h >> 16)


@register_jitable
def find_slot(buf, src, token):
    """Word offset of the table slot holding edge (src, token), or of the empty
    slot where it would be inserted. Terminates because the table is never full."""
    size = buf[H_HT_SIZE]
    slots = buf[H_O_SLOTS]
    i = probe_start(src, token, size)
    while True:
        w = slots + SLOT_WORDS * i
        s = buf[_ix(w + SRC)]
        if s == -1 or (s == src and buf[_ix(w + S_TOK)] == token):
            return w
        i = probe_next(i, size)


@register_jitable
def find_slot_start(buf, src, token):
    """Word offset of the first table slot ``find_slot`` probes for (src, token)."""
    return buf[H_O_SLOTS] + SLOT_WORDS * probe_start(src, token, buf[H_HT_SIZE])


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
    """Word offset of state ``s``'s hot record (``buf`` is unused: the states start at ``HEADER``)."""
    return HEADER + STATE_WORDS * s


@register_jitable
def aux(buf, s):
    """Word offset of state ``s``'s cold record."""
    return buf[H_O_AUX] + AUX_WORDS * s


@register_jitable
def edge(buf, src, token):
    """Where edge (src, token) is, as one int.

    ``>= 0``: the word offset of the word holding its target (the record's DST
    word, whose value may be negated, or a slot's DST word). Absent: ``-1`` if
    it would be src's inline first edge; ``-2`` if it would go into the table
    (src has one edge, so the table was not probed); ``<= -3``: ``-3 - value``
    is the word offset of the empty table slot where it would go.
    """
    r = state(buf, src)
    d = buf[_ix(r + DST)]
    if d == 0:
        return -1
    if buf[_ix(r + TOK)] == token:
        return r + DST
    if d > 0:
        return -2
    w = find_slot(buf, src, token)
    if buf[_ix(w + SRC)] == -1:
        return -3 - w
    return w + S_DST


@register_jitable
def transition(buf, src, token):
    """Target state of edge (src, token), or -1."""
    r = state(buf, src)
    d = buf[_ix(r + DST)]
    if d == 0:
        return -1
    if buf[_ix(r + TOK)] == token:
        return d if d > 0 else -d
    if d > 0:
        return -1
    w = find_slot(buf, src, token)
    if buf[_ix(w + SRC)] == -1:
        return -1
    return buf[_ix(w + S_DST)]


@register_jitable
def _target(buf, e):
    """Target state stored at edge word ``e`` (see ``edge``)."""
    d = buf[_ix(e)]
    return d if d > 0 else -d


@register_jitable
def _retarget(buf, e, dst):
    """Point the edge at word ``e`` to ``dst``, keeping the record's more-edges sign."""
    buf[_ix(e)] = dst if buf[_ix(e)] > 0 else -dst


@register_jitable
def _put_slot(buf, w, src, token, dst):
    """Fill the empty table slot at word offset ``w`` with edge (src, token, dst),
    chain it to ``src`` and mark src's record as having table edges."""
    a = aux(buf, src)
    buf[_ix(w + SRC)] = src
    buf[_ix(w + S_TOK)] = token
    buf[_ix(w + S_DST)] = dst
    buf[_ix(w + NEXT)] = buf[_ix(a + MORE)]
    buf[_ix(a + MORE)] = (w - buf[H_O_SLOTS]) // SLOT_WORDS
    buf[H_USED] += 1
    r = state(buf, src)
    if buf[_ix(r + DST)] > 0:
        buf[_ix(r + DST)] = -buf[_ix(r + DST)]


@host_inline
def _add_edge(buf, e, src, token, dst):
    """Add the absent edge (src, token, dst) where ``e = edge(buf, src, token)`` said."""
    if e == -1:
        r = state(buf, src)
        buf[_ix(r + TOK)] = token
        buf[_ix(r + DST)] = dst
    elif e == -2:
        _put_slot(buf, find_slot(buf, src, token), src, token, dst)
    else:
        _put_slot(buf, -3 - e, src, token, dst)


@register_jitable
def _chain_len(buf, s):
    """Number of state s's edges in the table (all but its first)."""
    slots = buf[H_O_SLOTS]
    count = 0
    i = buf[_ix(aux(buf, s) + MORE)]
    while i != -1:
        count += 1
        i = buf[_ix(slots + SLOT_WORDS * i + NEXT)]
    return count


@register_jitable
def extend(buf, token, occurrence, depth):
    """Append one token (online construction, O(1) amortized) and update the match.

    Returns ``APPENDED``; ``NO_ROOM`` (nothing written) when a capacity would be
    exceeded; ``OVERFLOWED`` when the blob already overflowed. ``token`` must be
    in [0, 2**31); callers validate.

    A read-only first pass walks the suffix-link path and counts the table
    slots the token will fill, so the capacity check happens before any write;
    the places it found are reused by the second pass.
    """
    if buf[H_OVERFLOW] != 0:
        return OVERFLOWED
    n = buf[H_N]
    ns = buf[H_NSTATES]
    if n >= buf[H_CAP_TOK] or ns + 2 > buf[H_CAP_ST]:
        return NO_ROOM
    last = buf[H_LAST]

    # Pass 1 (read only): states on the path from `last` that lack a `token`
    # edge get one to the new state (inline if they have no edge yet, else in
    # the table); the first that has one, p, decides the link. Remember where
    # the first two new edges go.
    k = 0
    need = 0
    e = 0
    e0 = -1
    e1 = -1
    p = last
    while p != -1:
        e = edge(buf, p, token)
        if e >= 0:
            break
        if e != -1:
            need += 1
        if k == 0:
            e0 = e
        elif k == 1:
            e1 = e
        k += 1
        p = buf[_ix(state(buf, p) + LINK)]
    q = -1
    lq = 0
    lp1 = 0
    clone = False
    if p != -1:
        q = _target(buf, e)
        lq = buf[_ix(state(buf, q) + LEN)]
        lp1 = buf[_ix(state(buf, p) + LEN)] + 1  # LEN never changes once written
        clone = lp1 != lq
        if clone:
            # The clone copies q's edges as they are after the first loop
            # below: its first inline, the others into the table. If q lies on
            # the path it has gained the `token` edge by then, a table edge
            # unless it was q's first.
            need += _chain_len(buf, q)
            r = last
            while r != p and buf[_ix(state(buf, r) + LEN)] > lq:
                r = buf[_ix(state(buf, r) + LINK)]
            if r == q and buf[_ix(state(buf, q) + DST)] != 0:
                need += 1
    if buf[H_USED] + need > max_used(buf[H_HT_SIZE]):
        return NO_ROOM

    # Pass 2: write.
    buf[_ix(buf[H_O_TEXT] + n)] = token
    cur = ns
    c = state(buf, cur)
    buf[_ix(c + LEN)] = buf[_ix(state(buf, last) + LEN)] + 1
    buf[_ix(c + TOK)] = 0
    buf[_ix(c + DST)] = 0
    ca = aux(buf, cur)
    buf[_ix(ca + POS)] = n
    buf[_ix(ca + MORE)] = -1
    ns += 1
    r = last
    for j in range(k):
        if j == 0:
            ej = e0
        elif j == 1 and (e1 > -3 or e1 != e0):  # a slot found empty stays so unless e0 took it
            ej = e1
        else:
            ej = edge(buf, r, token)
        _add_edge(buf, ej, r, token, cur)
        r = buf[_ix(state(buf, r) + LINK)]
    # The new state's suffix link and its length: the match (see _update_match).
    if p == -1:
        link = 0
        buf[_ix(c + LINK)] = 0
    elif not clone:
        link = q
        buf[_ix(c + LINK)] = q
    else:
        link = ns
        qr = state(buf, q)
        qa = aux(buf, q)
        cl = state(buf, ns)
        cla = aux(buf, ns)
        buf[_ix(cl + LEN)] = lp1
        buf[_ix(cl + LINK)] = buf[_ix(qr + LINK)]
        buf[_ix(cl + TOK)] = buf[_ix(qr + TOK)]
        d = buf[_ix(qr + DST)]
        buf[_ix(cl + DST)] = d if d > 0 else -d
        buf[_ix(cla + POS)] = buf[_ix(qa + POS)]
        buf[_ix(cla + MORE)] = -1
        slots = buf[H_O_SLOTS]
        i = buf[_ix(qa + MORE)]
        while i != -1:
            w = slots + SLOT_WORDS * i
            t = buf[_ix(w + S_TOK)]
            _put_slot(buf, find_slot(buf, ns, t), ns, t, buf[_ix(w + S_DST)])
            i = buf[_ix(w + NEXT)]
        _retarget(buf, e, ns)  # p's edge: record words and slots never move
        p = buf[_ix(state(buf, p) + LINK)]
        while p != -1:
            e = edge(buf, p, token)
            if e < 0 or _target(buf, e) != q:
                break
            _retarget(buf, e, ns)
            p = buf[_ix(state(buf, p) + LINK)]
        buf[_ix(qr + LINK)] = ns
        buf[_ix(c + LINK)] = ns
        ns += 1
    buf[H_NSTATES] = ns
    buf[H_LAST] = cur
    buf[H_N] = n + 1
    _update_match(buf, token, occurrence, depth, n + 1, link, lp1 if clone else lq)
    return APPENDED


@register_jitable
def extend_fixed(buf, token, occurrence, depth):
    """``extend`` for a blob that cannot grow (a device slot): when the token
    does not fit, mark the blob overflowed, so it stops growing and reports no
    match from then on."""
    r = extend(buf, token, occurrence, depth)
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
        if buf[_ix(text + e - j)] != buf[_ix(text + last - j)]:
            return False
    return True


@host_inline
def _near(buf, token, m):
    """NEAR_* rules: an end position of the matched m-suffix at or near the
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
    if buf[_ix(buf[H_O_TEXT] + anchor)] == token and (prev_m > 0 or m <= 1):
        return anchor  # the source continues: it agrees on prev_m + 1 >= m tokens
    if m > NEAR_MAX_CHECK:
        return -1
    for d in range(NEAR_WINDOW + 1):
        if _ends_with_suffix(buf, anchor + d, m):
            return anchor + d
        if d > 0 and _ends_with_suffix(buf, anchor - d, m):
            return anchor - d
    return -1


@host_inline
def _update_match(buf, token, occurrence, depth, n, s, m):
    """Record the match for the text of ``n`` tokens that just gained ``token``
    at position n-1: ``s`` is the suffix link of the new last state, ``m`` its
    length (passed in by ``extend``, which has them at hand: reading them back
    from the blob costs a host step dearly)."""
    start = -1
    if m > 0:
        e = -1
        if occurrence >= NEAR_FIRST:
            e = _near(buf, token, m)
        if e < 0:
            e = buf[_ix(aux(buf, s) + POS)]
        start = e + 1
    if occurrence >= NEAR_FIRST:
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
    # s's record was just read or written by extend: one cached read
    buf[H_BRANCHED] = 1 if m > 0 and buf[_ix(state(buf, s) + DST)] < 0 else 0
    if occurrence == RECENT or occurrence == NEAR_RECENT:
        # The states on the suffix-link path of the text are exactly those that
        # gain end position n-1; their old POS was read above.
        d = 0
        while s > 0 and d != depth:
            buf[_ix(aux(buf, s) + POS)] = n - 1
            s = buf[_ix(state(buf, s) + LINK)]
            d += 1


@register_jitable
def match_len(buf):
    """Length of the longest suffix of the text that also ends earlier (0 after overflow)."""
    if buf[H_OVERFLOW] != 0:
        return 0
    return buf[H_MATCH_LEN]


@register_jitable
def branched(buf):
    """1 if the earlier occurrences of the matched suffix went on with more than one
    distinct token (the draft is one of several continuations seen), else 0 (one
    continuation, or no match)."""
    if buf[H_OVERFLOW] != 0 or buf[H_MATCH_LEN] == 0:
        return 0
    return buf[H_BRANCHED]


@register_jitable
def state_branches(buf, s):
    """1 if state ``s`` (> 0) has more than one outgoing edge: the occurrences of its
    strings went on with several tokens (``follow``'s matches, the pool's)."""
    return 1 if s > 0 and buf[_ix(state(buf, s) + DST)] < 0 else 0


@host_inline
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
        out[j] = buf[_ix(text + i)]
        i += 1
        if i == end:  # wrap: the period is end - start (no division)
            i = start
    return k


@register_jitable
def follow(buf, s, m, token):
    """Match a text that is *not* appended to ``buf`` one token further.

    ``(s, m)``: a state of ``buf`` and a length such that the text's last ``m``
    tokens occur in ``buf``'s text ending where ``s``'s strings end (``(0, 0)``:
    nothing matched). Returns the pair for the text plus ``token``: the state
    after ``token``'s edge, else down the suffix links until one has it, as in
    matching a text against an automaton; O(1) amortized per token. ``m`` may
    be shorter than ``s``'s strings (a match found before ``buf`` grew, or one
    found from the text's last tokens only), so the length taken at a link is
    the smaller of the two: the pair always names a real occurrence, though
    after ``buf`` grew not necessarily the longest.
    """
    while True:
        t = transition(buf, s, token)
        if t > 0:
            return t, m + 1
        if s <= 0:
            return 0, 0
        s = buf[_ix(state(buf, s) + LINK)]
        m = min(m, buf[_ix(state(buf, s) + LEN)])


@register_jitable
def continuation(buf, s, stop):
    """Where the text continues after state ``s``'s chosen occurrence (its POS + 1),
    or -1 if the text ends there or continues with ``stop``."""
    if s <= 0:
        return -1
    i = buf[_ix(aux(buf, s) + POS)] + 1
    if i >= buf[H_N] or buf[_ix(buf[H_O_TEXT] + i)] == stop:
        return -1
    return i


@register_jitable
def draft_from(buf, start, out, k, stop):
    """Write ``buf``'s text from ``start`` into ``out[:k]``, ending at the text's end or
    before a ``stop`` token (no wrap, unlike ``draft``); -1 after. Returns the count."""
    text = buf[H_O_TEXT]
    n = buf[H_N]
    j = 0
    i = start
    while j < k and i < n:
        t = buf[_ix(text + i)]
        if t == stop:
            break
        out[j] = t
        j += 1
        i += 1
    for r in range(j, k):
        out[r] = -1
    return j


@register_jitable
def _copy_words(src, s0, dst, d0, count):
    """``dst[d0:d0+count] = src[s0:s0+count]``."""
    for j in range(count):
        dst[_ix(d0 + j)] = src[_ix(s0 + j)]


@register_jitable
def copy_into(src, dst):
    """Copy the automaton in ``src`` into ``dst``, a blob ``lay_out`` has laid
    out with room for it (how the host grows a request).

    The text and the records are copied word for word, and so is the table
    when its size is unchanged. A resized table is cleared and every edge
    re-inserted, because a slot's place depends on the table's size; the
    chains (MORE, NEXT) are then rebuilt, in an order irrelevant to the
    automaton.
    """
    ns = src[H_NSTATES]
    _copy_words(src, src[H_O_TEXT], dst, dst[H_O_TEXT], src[H_N])
    _copy_words(src, src[H_O_STATES], dst, dst[H_O_STATES], STATE_WORDS * ns)
    _copy_words(src, src[H_O_AUX], dst, dst[H_O_AUX], AUX_WORDS * ns)
    for h in (H_N, H_NSTATES, H_LAST, H_MATCH_LEN, H_MATCH_POS, H_OVERFLOW, H_ANCHOR, H_BRANCHED):
        dst[h] = src[h]
    size = src[H_HT_SIZE]
    slots = src[H_O_SLOTS]
    if size == dst[H_HT_SIZE]:
        _copy_words(src, slots, dst, dst[H_O_SLOTS], SLOT_WORDS * size)
        dst[H_USED] = src[H_USED]
        return
    clear_table(dst)
    o_aux = dst[H_O_AUX]
    for s in range(ns):
        dst[_ix(o_aux + AUX_WORDS * s + MORE)] = -1
    d_slots = dst[H_O_SLOTS]
    d_size = dst[H_HT_SIZE]
    for i in range(size):
        w = slots + SLOT_WORDS * i
        a = src[_ix(w + SRC)]
        if a == -1:
            continue
        t = src[_ix(w + S_TOK)]
        j = probe_start(a, t, d_size)
        # find_slot's probe without its key compare: the edges are distinct, and the compare is dear here
        while dst[_ix(d_slots + SLOT_WORDS * j + SRC)] != -1:
            j = probe_next(j, d_size)
        v = d_slots + SLOT_WORDS * j
        m = o_aux + AUX_WORDS * a + MORE
        dst[_ix(v + SRC)] = a
        dst[_ix(v + S_TOK)] = t
        dst[_ix(v + S_DST)] = src[_ix(w + S_DST)]
        dst[_ix(v + NEXT)] = dst[_ix(m)]
        dst[_ix(m)] = j  # a's records already say it has table edges: they were copied
    dst[H_USED] = src[H_USED]
