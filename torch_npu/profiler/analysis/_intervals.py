"""Interval arithmetic on (start_ns, end_ns) pairs: union, clipping, totals."""


def union(intervals) -> list:
    """Merge overlapping intervals; returns sorted disjoint [start, end] lists."""
    merged = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def clip(intervals, lo: int, hi: int) -> list:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if s < hi and e > lo]


def total(intervals) -> int:
    return sum(e - s for s, e in union(intervals))


def subtract(intervals, removed) -> list:
    """Parts of ``intervals`` not covered by ``removed`` (both lists of pairs)."""
    result = []
    cut = union(removed)
    for start, end in union(intervals):
        cursor = start
        for rs, re_ in cut:
            if re_ <= cursor or rs >= end:
                continue
            if rs > cursor:
                result.append((cursor, rs))
            cursor = max(cursor, re_)
        if cursor < end:
            result.append((cursor, end))
    return result
