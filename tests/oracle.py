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


def follow_starts(text, base):
    """Continuation starts of the follow-* policies ('first' or 'recent' base)."""
    starts = []
    prev_m, prev_start = 0, -1
    for i, (m, first, recent, _) in enumerate(matches(text)):
        if m == 0:
            start = -1
        elif prev_m > 0 and text[prev_start] == text[i]:
            start = prev_start + 1
        else:
            start = (first if base == "first" else recent) + 1
        starts.append(start)
        prev_m, prev_start = m, start
    return starts


def draft(text, n, start, k):
    """k tokens continuing from ``start`` in text[:n], periodic past the end."""
    if start < 0:
        return [-1] * k
    period = n - start
    return [text[start + j % period] for j in range(k)]
