"""Brute-force reference for the automaton: plain Python, no cleverness.

For every prefix T[:i+1] it finds, by comparing against every earlier end
position e < i, the longest suffix that also ends earlier and the earliest and
latest such e. The draft of an occurrence ending at e is the text from e+1,
repeated with period i+1-(e+1) where it runs into the end.
"""

from __future__ import annotations


def common_suffixes(text):
    """lcs[i][e] = length of the longest common suffix of text[:i+1] and text[:e+1], e < i."""
    lcs = []
    for i in range(len(text)):
        row = [0] * i
        for e in range(i):
            if text[e] == text[i]:
                row[e] = (lcs[i - 1][e - 1] + 1) if e > 0 else 1
        lcs.append(row)
    return lcs


def matches(text):
    """Per prefix: (m, first_end, recent_end, ends) with ends = all e of length-m occurrences."""
    out = []
    for i, row in enumerate(common_suffixes(text)):
        m = max(row, default=0)
        ends = [e for e, v in enumerate(row) if v == m] if m > 0 else []
        out.append((m, ends[0] if ends else -1, ends[-1] if ends else -1, ends))
    return out


def near_starts(text, base, window=8, max_check=32):
    """Continuation starts of the near-* policies ('first' or 'recent' base),
    from their definition: keep an anchor (the copy source's expected
    position); use it when it continues the match, else an end of the match
    within ``window`` of it (nearest first, matches up to ``max_check`` long),
    else the base policy's occurrence."""
    starts = []
    anchor, prev_m = -1, 0
    for i, (m, first, recent, ends) in enumerate(matches(text)):
        e = -1
        if m > 0 and anchor >= 0:
            if text[anchor] == text[i] and (prev_m > 0 or m <= 1):
                e = anchor
                assert e in ends
            elif m <= max_check:
                for d in range(window + 1):
                    if anchor + d in ends:
                        e = anchor + d
                        break
                    if d > 0 and anchor - d in ends:
                        e = anchor - d
                        break
        if m > 0 and e < 0:
            e = first if base == "first" else recent
        start = e + 1 if m > 0 else -1
        if start >= 0:
            anchor = start
        elif anchor >= 0 and anchor + 1 < i + 1:
            anchor += 1
        else:
            anchor = -1
        starts.append(start)
        prev_m = m
    return starts


def draft(text, n, start, k):
    """k tokens continuing from ``start`` in text[:n], periodic past the end."""
    if start < 0:
        return [-1] * k
    period = n - start
    return [text[start + j % period] for j in range(k)]


def pool_match(text, docs):
    """The longest suffix of ``text`` that occurs inside one of ``docs`` (the pooled
    texts), and every (doc index, end position) of such an occurrence."""
    best, ends = 0, []
    for d, doc in enumerate(docs):
        for e in range(len(doc)):
            m = 0
            while m < len(text) and m <= e and doc[e - m] == text[len(text) - 1 - m]:
                m += 1
            if m > best:
                best, ends = m, []
            if m == best and m > 0:
                ends.append((d, e))
    return best, ends


def pool_draft_ok(text, docs, m, draft, k):
    """Whether ``draft`` (-1 padded) is the continuation, within its doc and at most ``k``
    long, of some occurrence in ``docs`` of ``text``'s last ``m`` tokens."""
    real = [t for t in draft if t >= 0]
    if m < 1 or not real or len(real) != len(draft[: len(real)]) or any(t >= 0 for t in draft[len(real):]):
        return False
    suffix = list(text[len(text) - m:])
    for doc in docs:
        for e in range(m - 1, len(doc) - 1):
            if list(doc[e - m + 1: e + 1]) == suffix and list(doc[e + 1: e + 1 + k]) == real:
                return True
    return False
