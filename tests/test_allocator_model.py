"""The caching allocator against an independent model of its algorithm.

A small Python model of CUDA's caching allocator as torch_npu documents it
(32-byte pad and 512-byte rounding; small pool <= 1 MiB in 2 MiB segments;
20 MiB segments for requests under 10 MiB, 2 MiB rounding above; best fit by
(stream, size, address); splitting; coalescing on free; record_stream
deferring reuse until the recorded stream has progressed; empty_cache
releasing whole cached segments) predicts the address of every allocation
of a pseudo-random churn on two private streams, and the exact
memory_snapshot of their segments after each step. Private streams keep
the model independent of whatever other tests left in the pools: pools are
per stream, so only blocks of these streams can serve these requests.
"""
import random

import torch
import torch_npu  # noqa: F401

MiB = 1 << 20


def round_size(n):
    n += 32
    return 512 if n < 512 else (n + 511) // 512 * 512


def segment_size(rounded):
    if rounded <= MiB:
        return 2 * MiB
    if rounded < 10 * MiB:
        return 20 * MiB
    return (rounded + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)


class Block:
    def __init__(self, ptr, size, stream, small, seg):
        self.ptr, self.size, self.stream, self.small, self.seg = ptr, size, stream, small, seg
        self.prev = self.next = None
        self.allocated = self.pending = False
        self.requested = 0
        self.waiting = set()   # recorded streams that have not progressed since the free
        self.uses = set()


class Model:
    def __init__(self):
        self.free = []          # blocks in the pools (free, not pending)
        self.pending = []       # freed blocks waiting for recorded streams, in free order
        self.heads = []         # first block of each segment

    def _return(self, b):
        b.pending, b.requested, b.uses = False, 0, set()
        for nb in (b.prev, b.next):
            if nb is not None and not nb.allocated and not nb.pending:
                self.free.remove(nb)
                lo, hi = (nb, b) if nb is b.prev else (b, nb)
                lo.size += hi.size
                lo.next = hi.next
                if lo.next is not None:
                    lo.next.prev = lo
                if hi in self.heads:
                    self.heads[self.heads.index(hi)] = lo
                b = lo
        self.free.append(b)

    def _process_pending(self):
        still = []
        for b in self.pending:
            if b.waiting:
                still.append(b)
            else:
                self._return(b)
        self.pending = still

    def malloc(self, n, stream):
        """The block the allocator must return, or a new segment's first block (ptr None)."""
        self._process_pending()
        rounded = round_size(n)
        small = rounded <= MiB
        fits = [b for b in self.free if b.small == small and b.stream == stream and b.size >= rounded]
        if fits:
            b = min(fits, key=lambda x: (x.size, x.ptr))
            self.free.remove(b)
        else:
            b = Block(None, segment_size(rounded), stream, small, None)
            self.heads.append(b)
        rest = b.size - rounded
        if (rest >= 512) if small else (rest > MiB):
            r = Block(None if b.ptr is None else b.ptr + rounded, rest, stream, small, None)
            r.prev, r.next = b, b.next
            if r.next is not None:
                r.next.prev = r
            b.next, b.size = r, rounded
            self.free.append(r)
        b.allocated, b.requested = True, n
        return b

    def place(self, b, ptr):
        """Address of a new segment, learnt from the allocation itself."""
        x = b
        while x is not None:
            x.ptr = ptr
            ptr += x.size
            x = x.next

    def free_block(self, b):
        b.allocated = False
        if b.uses:
            b.pending, b.waiting = True, set(b.uses)
            self.pending.append(b)
        else:
            self._return(b)

    def progressed(self, stream):
        for b in self.pending:
            b.waiting.discard(stream)

    def empty_cache(self):
        for b in self.pending:
            self._return(b)
        self.pending = []
        for b in [b for b in self.free if b.prev is None and b.next is None]:
            self.free.remove(b)
            self.heads.remove(b)

    def snapshot(self):
        out = []
        for h in sorted(self.heads, key=lambda h: h.ptr):
            blocks, x = [], h
            while x is not None:
                state = ("active_allocated" if x.allocated else
                         "active_pending_free" if x.pending else "inactive")
                blocks.append((x.ptr, x.size, x.requested, state))
                x = x.next
            out.append((h.ptr, h.stream, "small" if h.small else "large", blocks))
        return out


def _device_snapshot(stream_ids):
    out = []
    for s in torch.npu.memory_snapshot():
        if s["device"] != 0 or s["stream"] not in stream_ids:
            continue
        blocks = [(b["address"], b["size"], b["requested_size"], b["state"]) for b in s["blocks"]]
        out.append((s["address"], s["stream"], s["segment_type"], blocks))
    return sorted(out)


def _inactive_split_from_snapshot():
    # What memory_stats' inactive_split counters must say: the free blocks
    # (in a pool, not waiting for streams) of segments split in several.
    out = {}
    for pool in ("small_pool", "large_pool"):
        segs = [s for s in torch.npu.memory_snapshot()
                if s["device"] == 0 and s["segment_type"] == pool.split("_")[0] and len(s["blocks"]) > 1]
        free = [b for s in segs for b in s["blocks"] if b["state"] == "inactive"]
        out[f"inactive_split.{pool}.current"] = len(free)
        out[f"inactive_split_bytes.{pool}.current"] = sum(b["size"] for b in free)
    return out


def _inactive_split_stats():
    st = torch.npu.memory_stats(0)
    return {k: st[k] for pool in ("small_pool", "large_pool")
            for k in (f"inactive_split.{pool}.current", f"inactive_split_bytes.{pool}.current")}


def test_churn_on_two_streams_matches_the_model():
    torch.npu.set_device(0)
    s1, s2 = torch.npu.Stream(), torch.npu.Stream()
    streams = {s1.stream_id: s1, s2.stream_id: s2}
    model = Model()
    rng = random.Random(20)
    # Around the pool and split boundaries: 19 MiB - 2100 rounds to a 19 MiB
    # block in a 20 MiB segment, leaving exactly 1 MiB (not split).
    sizes = [1, 100, 480, 481, 4000, 65536, 300000, MiB - 2100, MiB - 31, 3 * MiB, 9 * MiB, 11 * MiB, 19 * MiB - 2100]
    live = []        # (tensor, model block)
    for step in range(1500):
        r = rng.random()
        if r < 0.5 or not live:
            n = rng.choice(sizes) + rng.randrange(0, 2000)
            sid = rng.choice(sorted(streams))
            with torch.npu.stream(streams[sid]):
                t = torch.empty(n, dtype=torch.uint8, device="npu")
            b = model.malloc(n, sid)
            if b.ptr is None:
                model.place(b, t.data_ptr())
            assert t.data_ptr() == b.ptr, (step, n)
            if rng.random() < 0.25:
                other = s2 if sid == s1.stream_id else s1
                t.record_stream(other)
                b.uses.add(other.stream_id)
            live.append((t, b))
        elif r < 0.88:
            t, b = live.pop(rng.randrange(len(live)))
            del t
            model.free_block(b)
        elif r < 0.93:
            s = rng.choice([s1, s2])
            torch.npu.Event().record(s)
            model.progressed(s.stream_id)
        elif r < 0.97:
            s = rng.choice([s1, s2])
            s.synchronize()
            model.progressed(s.stream_id)
        else:
            torch.npu.empty_cache()
            model.empty_cache()
        assert _device_snapshot(streams) == sorted(model.snapshot()), step
        assert _inactive_split_stats() == _inactive_split_from_snapshot(), step
    live.clear()
