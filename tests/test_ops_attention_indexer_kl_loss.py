"""npu_dense_lightning_indexer_grad_kl_loss and
npu_sparse_lightning_indexer_grad_kl_loss against float64 loops of the documented formulas
(Ascend/op-plugin docs + goldens), autograd of the KL loss, and finite differences."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

CLIP = 1e-8


# ---------------------------------------------------------------- inputs and batches

def per_batch(x, layout, starts, lengths):
    """[b] -> the rows of batch b, shaped [S, ...] (BSND: x[b, :S]; TND: cumulative slices)."""
    if layout == "BSND":
        return [x[b, :n] for b, n in enumerate(lengths)]
    return [x[s:s + n] for s, n in zip(starts, lengths)]


def batches(layout, b, s1, s2, qlen=None, klen=None):
    if layout == "BSND":
        return [0] * b, [s1] * b, [0] * b, [s2] * b
    qs = [0] + qlen[:-1]
    ks = [0] + klen[:-1]
    return qs, [y - x for x, y in zip(qs, qlen)], ks, [y - x for x, y in zip(ks, klen)]


def make_inputs(gen, layout, dtype, n1, n2, ni, d, dr, b=2, s1=5, s2=7, qlen=None, klen=None, wscale=1.0):
    lead_q = (b, s1) if layout == "BSND" else (qlen[-1],)
    lead_k = (b, s2) if layout == "BSND" else (klen[-1],)
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    t = dict(query=r(*lead_q, n1, d), key=r(*lead_k, n2, d), query_index=r(*lead_q, ni, d) * 0.5,
             key_index=r(*lead_k, 1, d) * 0.5, weights=r(*lead_q, ni) * wscale)
    if dr:
        t["query_rope"], t["key_rope"] = r(*lead_q, n1, dr), r(*lead_k, n2, dr)
    return t


def causal(t, j, s1, s2):
    return j <= t + s2 - s1


# ---------------------------------------------------------------- float64 loop references

def main_scores(t_in, layout, starts, scale):
    """[batch] -> float64 scaled scores [N1, S1, S2] of q.[k] with the rope parts appended."""
    qs, ql, ks, kl = starts
    qf = t_in["query"].double()
    kf = t_in["key"].double()
    if "query_rope" in t_in:
        qf = torch.cat([qf, t_in["query_rope"].double()], -1)
        kf = torch.cat([kf, t_in["key_rope"].double()], -1)
    out = []
    for q, k in zip(per_batch(qf, layout, qs, ql), per_batch(kf, layout, ks, kl)):
        n1, n2 = q.shape[1], k.shape[1]
        sc = torch.zeros(n1, q.shape[0], k.shape[0], dtype=torch.float64)
        for h in range(n1):
            sc[h] = q[:, h] @ k[:, h // (n1 // n2)].T * scale
        out.append(sc)
    return out


def index_scores(t_in, layout, starts):
    """[batch] -> (relu(S) [Ni, S1, S2], I [S1, S2]) in float64."""
    qs, ql, ks, kl = starts
    res = []
    for qi, ki, w in zip(per_batch(t_in["query_index"].double(), layout, qs, ql),
                         per_batch(t_in["key_index"].double(), layout, ks, kl),
                         per_batch(t_in["weights"].double(), layout, qs, ql)):
        relu = torch.stack([torch.relu(qi[:, h] @ ki[:, 0].T) for h in range(qi.shape[1])])
        res.append((relu, (relu * w.T.unsqueeze(-1)).sum(0)))
    return res


def row_stats(x, mask):
    """max / sum(exp(x - max)) over the unmasked entries of each row (0 / 0 when none)."""
    m = torch.zeros(x.shape[:-1], dtype=torch.float64)
    s = torch.zeros(x.shape[:-1], dtype=torch.float64)
    flat_x, flat_m = x.reshape(-1, x.shape[-1]), mask.expand_as(x).reshape(-1, x.shape[-1])
    for r in range(flat_x.shape[0]):
        vals = flat_x[r][~flat_m[r]]
        if vals.numel():
            mm = vals.max()
            m.view(-1)[r], s.view(-1)[r] = mm, torch.exp(vals - mm).sum()
    return m, s


def causal_mask(s1, s2):
    return torch.tensor([[not causal(t, j, s1, s2) for j in range(s2)] for t in range(s1)])


def consistent_main_stats(t_in, layout, starts, scale, n2, sel=None):
    """float64 softmax_max / softmax_sum laid out (B, N2, S1, G) / (N2, T1, G), from the true scores
    (over the causal keys, or over the valid slots of ``sel`` for the sparse op)."""
    qs, ql, ks, kl = starts
    n1 = t_in["query"].shape[-2]
    g = n1 // n2
    rows = t_in["query"].shape[0] * t_in["query"].shape[1] if layout == "BSND" else t_in["query"].shape[0]
    smax = torch.zeros(n1, rows, dtype=torch.float64)
    ssum = torch.zeros(n1, rows, dtype=torch.float64)
    for bi, sc in enumerate(main_scores(t_in, layout, starts, scale)):
        s1, s2 = sc.shape[1], sc.shape[2]
        if sel is None:
            vals, mask = sc, causal_mask(s1, s2)
        else:
            idx, valid = sel[bi]
            vals = torch.stack([torch.stack([sc[h, t, idx[t].clamp_min(0)] for t in range(s1)]) for h in range(n1)])
            mask = ~valid
        m, s = row_stats(vals, mask.unsqueeze(0))
        base = bi * t_in["query"].shape[1] if layout == "BSND" else qs[bi]
        smax[:, base:base + s1], ssum[:, base:base + s1] = m, s
    return to_layout(smax, layout, t_in, n2, g), to_layout(ssum, layout, t_in, n2, g)


def to_layout(stat, layout, t_in, n2, g):
    """[N1, rows] -> (B, N2, S1, G) / (N2, T1, G) with head h = n2 * G + g."""
    if layout == "BSND":
        b, s1 = t_in["query"].shape[:2]
        return stat.reshape(n2, g, b, s1).permute(2, 0, 3, 1).contiguous()
    return stat.reshape(n2, g, -1).permute(0, 2, 1).contiguous()


def head_stat(stat, layout, b, base, t, h, g):
    return float(stat[b, h // g, t, h % g]) if layout == "BSND" else float(stat[h // g, base + t, h % g])


def dense_reference(t_in, layout, starts, smax, ssum, imax, isum, scale):
    qs, ql, ks, kl = starts
    n1, n2 = t_in["query"].shape[-2], t_in["key"].shape[-2]
    g = n1 // n2
    d_qi = torch.zeros(t_in["query_index"].shape, dtype=torch.float64)
    d_ki = torch.zeros(t_in["key_index"].shape, dtype=torch.float64)
    d_w = torch.zeros(t_in["weights"].shape, dtype=torch.float64)
    qi_b = per_batch(t_in["query_index"].double(), layout, qs, ql)
    ki_b = per_batch(t_in["key_index"].double(), layout, ks, kl)
    w_b = per_batch(t_in["weights"].double(), layout, qs, ql)
    dqi_b, dki_b, dw_b = per_batch(d_qi, layout, qs, ql), per_batch(d_ki, layout, ks, kl), per_batch(d_w, layout, qs, ql)
    loss = 0.0
    for b, (sc, (relu, score)) in enumerate(zip(main_scores(t_in, layout, starts, scale),
                                                index_scores(t_in, layout, starts))):
        s1, s2 = sc.shape[1], sc.shape[2]
        for t in range(s1):
            im = float(imax[b, 0, t]) if layout == "BSND" else float(imax[0, qs[b] + t])
            isu = float(isum[b, 0, t]) if layout == "BSND" else float(isum[0, qs[b] + t])
            for j in range(s2):
                if not causal(t, j, s1, s2):
                    continue
                p = sum(math.exp(float(sc[h, t, j]) - head_stat(smax, layout, b, qs[b], t, h, g))
                        / head_stat(ssum, layout, b, qs[b], t, h, g) for h in range(n1)) / n1
                s = math.exp(float(score[t, j]) - im) / isu
                loss += p * (math.log(max(p, CLIP)) - math.log(max(s, CLIP)))
                d_i = s - p
                for h in range(relu.shape[0]):
                    dw_b[b][t, h] += d_i * relu[h, t, j]
                    if relu[h, t, j] > 0:
                        d_s = d_i * w_b[b][t, h]
                        dqi_b[b][t, h] += d_s * ki_b[b][j, 0]
                        dki_b[b][j, 0] += d_s * qi_b[b][t, h]
    return d_qi, d_ki, d_w, loss


def index_stats(t_in, layout, starts):
    """softmax_max_index / softmax_sum_index (B, 1, S1) / (1, T1) from the true indexer scores (float64)."""
    qs, ql, ks, kl = starts
    rows = t_in["query"].shape[0] * t_in["query"].shape[1] if layout == "BSND" else t_in["query"].shape[0]
    m_all = torch.zeros(rows, dtype=torch.float64)
    s_all = torch.zeros(rows, dtype=torch.float64)
    for b, (_, score) in enumerate(index_scores(t_in, layout, starts)):
        m, s = row_stats(score, causal_mask(*score.shape))
        base = b * t_in["query"].shape[1] if layout == "BSND" else qs[b]
        m_all[base:base + score.shape[0]], s_all[base:base + score.shape[0]] = m, s
    if layout == "BSND":
        shape = (t_in["query"].shape[0], 1, t_in["query"].shape[1])
        return m_all.reshape(shape[0], shape[2]).unsqueeze(1), s_all.reshape(shape[0], shape[2]).unsqueeze(1)
    return m_all.unsqueeze(0), s_all.unsqueeze(0)


def selections(indices, layout, starts):
    """[batch] -> (indices [S1, topK] long, valid [S1, topK]) with the documented validity."""
    qs, ql, ks, kl = starts
    out = []
    for b, idx in enumerate(per_batch(indices[..., 0, :].long(), layout, qs, ql)):
        s1, s2 = ql[b], kl[b]
        valid = torch.tensor([[0 <= int(idx[t, k]) < s2 and causal(t, int(idx[t, k]), s1, s2)
                               for k in range(idx.shape[1])] for t in range(s1)], dtype=torch.bool)
        out.append((idx, valid.reshape(s1, idx.shape[1])))
    return out


def sparse_reference(t_in, indices, layout, starts, smax, ssum, scale):
    qs, ql, ks, kl = starts
    n1, n2 = t_in["query"].shape[-2], t_in["key"].shape[-2]
    g = n1 // n2
    d_qi = torch.zeros(t_in["query_index"].shape, dtype=torch.float64)
    d_ki = torch.zeros(t_in["key_index"].shape, dtype=torch.float64)
    d_w = torch.zeros(t_in["weights"].shape, dtype=torch.float64)
    qi_b = per_batch(t_in["query_index"].double(), layout, qs, ql)
    ki_b = per_batch(t_in["key_index"].double(), layout, ks, kl)
    w_b = per_batch(t_in["weights"].double(), layout, qs, ql)
    dqi_b, dki_b, dw_b = per_batch(d_qi, layout, qs, ql), per_batch(d_ki, layout, ks, kl), per_batch(d_w, layout, qs, ql)
    loss = 0.0
    sel = selections(indices, layout, starts)
    for b, (sc, (relu, score)) in enumerate(zip(main_scores(t_in, layout, starts, scale),
                                                index_scores(t_in, layout, starts))):
        idx, valid = sel[b]
        for t in range(sc.shape[1]):
            slots = [k for k in range(idx.shape[1]) if valid[t, k]]
            if not slots:
                continue
            vals = [float(score[t, int(idx[t, k])]) for k in slots]
            top = max(vals)
            denom = sum(math.exp(v - top) for v in vals)
            for k, v in zip(slots, vals):
                j = int(idx[t, k])
                p = sum(math.exp(float(sc[h, t, j]) - head_stat(smax, layout, b, qs[b], t, h, g))
                        / head_stat(ssum, layout, b, qs[b], t, h, g) for h in range(n1)) / n1
                s = math.exp(v - top) / denom
                loss += p * (math.log(max(p, CLIP)) - math.log(max(s, CLIP)))
                d_i = s - p
                for h in range(relu.shape[0]):
                    dw_b[b][t, h] += d_i * relu[h, t, j]
                    if relu[h, t, j] > 0:
                        d_s = d_i * w_b[b][t, h]
                        dqi_b[b][t, h] += d_s * ki_b[b][j, 0]
                        dki_b[b][j, 0] += d_s * qi_b[b][t, h]
    return d_qi, d_ki, d_w, loss


def random_indices(gen, layout, starts, top_k, rows_shape):
    """topK slots per query row: causal keys (with a repeat), then -1 padding and one out-of-window index."""
    qs, ql, ks, kl = starts
    idx = torch.full(rows_shape + (1, top_k), -1, dtype=torch.int32)
    flat = idx.flatten(0, 1) if layout == "BSND" else idx
    for b in range(len(ql)):
        base = b * (idx.shape[1] if layout == "BSND" else 0) + (0 if layout == "BSND" else qs[b])
        for t in range(ql[b]):
            n = max(0, min(top_k - 1, t + kl[b] - ql[b] + 1))
            if n:
                pick = torch.randint(0, t + kl[b] - ql[b] + 1, (n,), generator=gen)
                flat[base + t, 0, :n] = pick.to(torch.int32)
            if n + 1 < top_k and t + kl[b] - ql[b] + 1 < kl[b]:
                flat[base + t, 0, n + 1] = kl[b] - 1          # beyond the causal bound: ignored
    return idx


def call(op, t_in, device, *args, **kw):
    moved = {k: v.to(device) for k, v in t_in.items()}
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    rope = {"query_rope": moved.get("query_rope"), "key_rope": moved.get("key_rope")}
    return op(moved["query"], moved["key"], moved["query_index"], moved["key_index"], moved["weights"], *args,
              **rope, **kw)


def assert_close(got, want, rtol, atol_frac):
    got, want = got.cpu().double(), want.double()
    atol = atol_frac * max(1e-12, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


CASES = [  # layout, n1, n2, ni, dr, lengths
    ("BSND", 4, 4, 3, 4, None),
    ("BSND", 4, 2, 2, 0, None),
    ("TND", 2, 1, 3, 4, ([4, 9], [6, 9])),     # batch 2: S1=5 > S2=3, rows without keys
]


def case_inputs(gen, case, dtype, wscale=1.0):
    layout, n1, n2, ni, dr, lengths = case
    qlen, klen = lengths if lengths else (None, None)
    t_in = make_inputs(gen, layout, dtype, n1, n2, ni, 8, dr, qlen=qlen, klen=klen, wscale=wscale)
    starts = batches(layout, 2, 5, 7, qlen, klen)
    kw = dict(layout=layout, actual_seq_qlen=qlen, actual_seq_klen=klen)
    return t_in, starts, kw


# ---------------------------------------------------------------- dense

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=["bsnd", "bsnd_gqa_norope", "tnd"])
def test_dense_matches_float64_loops(device, case):
    gen = torch.Generator().manual_seed(1)
    t_in, starts, kw = case_inputs(gen, case, torch.float32)
    n1, n2 = case[1], case[2]
    # arbitrary (not self-consistent) statistics, as the op-plugin golden uses
    lead = t_in["query"].shape[:-2]
    smax_shape = (lead[0], n2, lead[1], n1 // n2) if case[0] == "BSND" else (n2, lead[0], n1 // n2)
    smax = torch.rand(smax_shape, generator=gen) * 2 + 1
    ssum = torch.rand(smax_shape, generator=gen) * 2 + 4
    istat_shape = (lead[0], 1, lead[1]) if case[0] == "BSND" else (1, lead[0])
    imax = torch.rand(istat_shape, generator=gen) + 1
    isum = torch.rand(istat_shape, generator=gen) * 3 + 2
    got = call(torch_npu.npu_dense_lightning_indexer_grad_kl_loss, t_in, device, smax, ssum, imax, isum, 0.35, **kw)
    want = dense_reference(t_in, case[0], starts, smax, ssum, imax, isum, 0.35)
    assert got[0].device.type == device and got[3].shape == (1,) and got[3].dtype == torch.float32
    for g_, w_ in zip(got[:3], want[:3]):
        assert_close(g_, w_, 1e-4, 1e-5)
    assert abs(got[3].item() - want[3]) <= 1e-4 * abs(want[3]) + 1e-6


def autograd_loss(t_in, layout, starts, scale, n2, sel=None):
    """float64 KL(p || softmax(I)) with a true log-softmax, differentiable in qi, ki, w."""
    qi = t_in["query_index"].double().requires_grad_()
    ki = t_in["key_index"].double().requires_grad_()
    w = t_in["weights"].double().requires_grad_()
    qs, ql, ks, kl = starts
    n1 = t_in["query"].shape[-2]
    total = 0
    for b, sc in enumerate(main_scores(t_in, layout, starts, scale)):
        s1, s2 = sc.shape[1], sc.shape[2]
        qb = per_batch(qi, layout, qs, ql)[b]
        kb = per_batch(ki, layout, ks, kl)[b]
        wb = per_batch(w, layout, qs, ql)[b]
        score = sum(wb[:, h:h + 1] * torch.relu(qb[:, h] @ kb[:, 0].T) for h in range(qb.shape[1]))
        if sel is None:
            mask = causal_mask(s1, s2)
            p = torch.softmax(sc.masked_fill(mask, -math.inf), -1).nan_to_num(0).mean(0)
            logs = torch.log_softmax(score.masked_fill(mask, -math.inf), -1)
        else:
            idx, valid = sel[b]
            gi = idx.clamp_min(0)
            p = torch.softmax(torch.gather(sc, 2, gi.expand(n1, -1, -1)).masked_fill(~valid, -math.inf), -1)
            p = p.nan_to_num(0).mean(0)
            logs = torch.log_softmax(torch.gather(score, 1, gi).masked_fill(~valid, -math.inf), -1)
        terms = torch.where(p > 0, p * (torch.log(p.clamp_min(CLIP)) - logs.masked_fill(p == 0, 0)),
                            torch.zeros_like(p))
        total = total + terms.sum()
    grads = torch.autograd.grad(total, [qi, ki, w])
    return total.item(), grads


@pytest.mark.parametrize("case", CASES, ids=["bsnd", "bsnd_gqa_norope", "tnd"])
def test_dense_gradients_are_autograd_of_the_loss(case):
    """With self-consistent statistics (main attention from its own softmax, index stats as
    npu_dense_lightning_indexer_softmax_lse defines them) the outputs are d loss / d inputs."""
    gen = torch.Generator().manual_seed(2)
    t_in, starts, kw = case_inputs(gen, case, torch.float64)
    smax, ssum = consistent_main_stats(t_in, case[0], starts, 0.3, case[2])
    imax, isum = index_stats(t_in, case[0], starts)
    got = call(torch_npu.npu_dense_lightning_indexer_grad_kl_loss, t_in, "cpu", smax.double(), ssum.double(),
               imax.double(), isum.double(), 0.3, **kw)
    loss, grads = autograd_loss(t_in, case[0], starts, 0.3, case[2])
    for g_, w_ in zip(got[:3], grads):
        assert_close(g_, w_, 1e-6, 1e-7)
    assert got[3].dtype == torch.float64 and abs(got[3].item() - loss) < 1e-8 * max(1.0, abs(loss))
    # the companion op's statistics give the same result (float32 stats, float32 compute)
    f32 = {k: v.float() for k, v in t_in.items()}
    lse = torch_npu.npu_dense_lightning_indexer_softmax_lse(f32["query_index"], f32["key_index"], f32["weights"], **kw)
    got32 = call(torch_npu.npu_dense_lightning_indexer_grad_kl_loss, f32, "npu", smax.float(), ssum.float(), *lse, 0.3,
                 **kw)
    for g_, w_ in zip(got32[:3], grads):
        assert_close(g_, w_, 1e-3, 1e-4)


def test_dense_finite_differences():
    case = CASES[0]
    gen = torch.Generator().manual_seed(3)
    t_in, starts, kw = case_inputs(gen, case, torch.float64)
    smax, ssum = consistent_main_stats(t_in, case[0], starts, 0.3, case[2])

    def loss_at(inputs):
        imax, isum = index_stats(inputs, case[0], starts)
        return call(torch_npu.npu_dense_lightning_indexer_grad_kl_loss, inputs, "cpu", smax.double(), ssum.double(),
                    imax.double(), isum.double(), 0.3, **kw)

    out = loss_at(t_in)
    eps = 1e-6
    for pos, name in ((0, "query_index"), (1, "key_index"), (2, "weights")):
        for _ in range(3):
            flat_i = int(torch.randint(0, t_in[name].numel(), (1,), generator=gen))
            plus, minus = dict(t_in), dict(t_in)
            plus[name] = t_in[name].clone()
            minus[name] = t_in[name].clone()
            plus[name].view(-1)[flat_i] += eps
            minus[name].view(-1)[flat_i] -= eps
            fd = (loss_at(plus)[3].item() - loss_at(minus)[3].item()) / (2 * eps)
            assert abs(out[pos].reshape(-1)[flat_i].item() - fd) < 1e-5 * max(1.0, abs(fd)), (name, flat_i)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_dense_low_precision(device, dtype):
    case = CASES[0]
    gen = torch.Generator().manual_seed(4)
    t_in, starts, kw = case_inputs(gen, case, dtype)
    smax, ssum = consistent_main_stats(t_in, case[0], starts, 0.3, case[2])
    imax, isum = index_stats(t_in, case[0], starts)
    smax, ssum, imax, isum = smax.float(), ssum.float(), imax.float(), isum.float()
    got = call(torch_npu.npu_dense_lightning_indexer_grad_kl_loss, t_in, device, smax, ssum, imax, isum, 0.3, **kw)
    want = dense_reference(t_in, case[0], starts, smax, ssum, imax, isum, 0.3)
    assert [g_.dtype for g_ in got] == [dtype, dtype, dtype, torch.float32]
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    for g_, w_ in zip(got[:3], want[:3]):
        assert_close(g_, w_, tol, tol)
    assert abs(got[3].item() - want[3]) <= 1e-3 * abs(want[3]) + 1e-5


# ---------------------------------------------------------------- sparse

SPARSE_CASES = [  # layout, n1, n2, ni, dr, lengths
    ("BSND", 4, 1, 3, 4, None),
    ("TND", 4, 1, 2, 0, ([4, 9], [6, 9])),
]


def sparse_inputs(gen, case, dtype, top_k=5):
    t_in, starts, kw = case_inputs(gen, case, dtype)
    rows_shape = tuple(t_in["query"].shape[:-2])
    idx = random_indices(gen, case[0], starts, top_k, rows_shape)
    return t_in, starts, kw, idx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SPARSE_CASES, ids=["bsnd", "tnd"])
def test_sparse_matches_float64_loops(device, case):
    gen = torch.Generator().manual_seed(5)
    t_in, starts, kw, idx = sparse_inputs(gen, case, torch.float32)
    n1 = case[1]
    lead = t_in["query"].shape[:-2]
    shape = (lead[0], 1, lead[1], n1) if case[0] == "BSND" else (1, lead[0], n1)
    smax = torch.rand(shape, generator=gen) * 2 + 1
    ssum = torch.rand(shape, generator=gen) * 2 + 3
    got = call(torch_npu.npu_sparse_lightning_indexer_grad_kl_loss, t_in, device, idx, smax, ssum, 0.4, **kw)
    want = sparse_reference(t_in, idx, case[0], starts, smax, ssum, 0.4)
    assert got[1].device.type == device and got[3].shape == (1,)
    for g_, w_ in zip(got[:3], want[:3]):
        assert_close(g_, w_, 1e-4, 1e-5)
    assert abs(got[3].item() - want[3]) <= 1e-4 * abs(want[3]) + 1e-6


@pytest.mark.parametrize("case", SPARSE_CASES, ids=["bsnd", "tnd"])
def test_sparse_gradients_are_autograd_of_the_loss(case):
    gen = torch.Generator().manual_seed(6)
    t_in, starts, kw, idx = sparse_inputs(gen, case, torch.float64)
    sel = selections(idx, case[0], starts)
    smax, ssum = consistent_main_stats(t_in, case[0], starts, 0.3, 1, sel=sel)
    got = call(torch_npu.npu_sparse_lightning_indexer_grad_kl_loss, t_in, "cpu", idx, smax.double(), ssum.double(),
               0.3, **kw)
    loss, grads = autograd_loss(t_in, case[0], starts, 0.3, 1, sel=sel)
    for g_, w_ in zip(got[:3], grads):
        assert_close(g_, w_, 1e-6, 1e-7)
    assert abs(got[3].item() - loss) < 1e-8 * max(1.0, abs(loss))
    # finite differences straight on the op's loss (its indexer softmax is internal)
    eps = 1e-6
    for pos, name in ((0, "query_index"), (1, "key_index"), (2, "weights")):
        flat_i = int(torch.argmax(got[pos].abs().reshape(-1)))
        plus, minus = dict(t_in), dict(t_in)
        plus[name], minus[name] = t_in[name].clone(), t_in[name].clone()
        plus[name].view(-1)[flat_i] += eps
        minus[name].view(-1)[flat_i] -= eps
        args = (idx, smax.double(), ssum.double(), 0.3)
        fd = (call(torch_npu.npu_sparse_lightning_indexer_grad_kl_loss, plus, "cpu", *args, **kw)[3].item()
              - call(torch_npu.npu_sparse_lightning_indexer_grad_kl_loss, minus, "cpu", *args, **kw)[3].item()) / (2 * eps)
        assert abs(got[pos].reshape(-1)[flat_i].item() - fd) < 1e-5 * max(1.0, abs(fd)), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparse_low_precision_npu(dtype):
    case = SPARSE_CASES[0]
    gen = torch.Generator().manual_seed(7)
    t_in, starts, kw, idx = sparse_inputs(gen, case, dtype)
    sel = selections(idx, case[0], starts)
    smax, ssum = (x.float() for x in consistent_main_stats(t_in, case[0], starts, 0.3, 1, sel=sel))
    got = call(torch_npu.npu_sparse_lightning_indexer_grad_kl_loss, t_in, "npu", idx, smax, ssum, 0.3, **kw)
    want = sparse_reference(t_in, idx, case[0], starts, smax, ssum, 0.3)
    assert [g_.dtype for g_ in got] == [dtype, dtype, dtype, torch.float32]
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    for g_, w_ in zip(got[:3], want[:3]):
        assert_close(g_, w_, tol, tol)
    assert abs(got[3].item() - want[3]) <= 1e-3 * abs(want[3]) + 1e-5


# ---------------------------------------------------------------- shapes and errors

def test_fake_tensor_shapes():
    with FakeTensorMode():
        q, k = torch.empty(2, 6, 8, 16, dtype=torch.bfloat16), torch.empty(2, 9, 8, 16, dtype=torch.bfloat16)
        qi, ki = torch.empty(2, 6, 4, 12, dtype=torch.bfloat16), torch.empty(2, 9, 1, 12, dtype=torch.bfloat16)
        w = torch.empty(2, 6, 4, dtype=torch.float32)
        sm = torch.empty(2, 8, 6, 1)
        si = torch.empty(2, 1, 6)
        out = torch_npu.npu_dense_lightning_indexer_grad_kl_loss(q, k, qi, ki, w, sm, sm, si, si, 0.1)
        assert [tuple(o.shape) for o in out] == [(2, 6, 4, 12), (2, 9, 1, 12), (2, 6, 4), (1,)]
        assert [o.dtype for o in out] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
        k1 = torch.empty(10, 1, 16, dtype=torch.float16)
        q1 = torch.empty(7, 8, 16, dtype=torch.float16)
        qi1, ki1 = torch.empty(7, 4, 12, dtype=torch.float16), torch.empty(10, 1, 12, dtype=torch.float16)
        idx = torch.empty(7, 1, 3, dtype=torch.int32)
        sm1 = torch.empty(1, 7, 8)
        out = torch_npu.npu_sparse_lightning_indexer_grad_kl_loss(
            q1, k1, qi1, ki1, torch.empty(7, 4, dtype=torch.float16), idx, sm1, sm1, 0.1, layout="TND",
            actual_seq_qlen=[3, 7], actual_seq_klen=[5, 10])
        assert [tuple(o.shape) for o in out] == [(7, 4, 12), (10, 1, 12), (7, 4), (1,)]
    meta = torch_npu.npu_dense_lightning_indexer_grad_kl_loss(
        *(t.to("meta") for t in (torch.empty(1, 3, 2, 4), torch.empty(1, 3, 2, 4), torch.empty(1, 3, 2, 4),
                                 torch.empty(1, 3, 1, 4), torch.empty(1, 3, 2), torch.empty(1, 2, 3, 1),
                                 torch.empty(1, 2, 3, 1), torch.empty(1, 1, 3), torch.empty(1, 1, 3))), 1.0)
    assert meta[0].device.type == "meta" and tuple(meta[1].shape) == (1, 3, 1, 4)


def _dense_args(**over):
    a = dict(query=torch.randn(1, 3, 2, 4), key=torch.randn(1, 3, 2, 4), query_index=torch.randn(1, 3, 2, 4),
             key_index=torch.randn(1, 3, 1, 4), weights=torch.randn(1, 3, 2), softmax_max=torch.zeros(1, 2, 3, 1),
             softmax_sum=torch.ones(1, 2, 3, 1), softmax_max_index=torch.zeros(1, 1, 3),
             softmax_sum_index=torch.ones(1, 1, 3), scale_value=1.0)
    a.update(over)
    return a


def _sparse_args(**over):
    a = _dense_args()
    for k in ("softmax_max_index", "softmax_sum_index"):
        a.pop(k)
    a.update(key=torch.randn(1, 3, 1, 4), softmax_max=torch.zeros(1, 1, 3, 2), softmax_sum=torch.ones(1, 1, 3, 2),
             sparse_indices=torch.zeros(1, 3, 1, 2, dtype=torch.int32))
    a.update(over)
    return a


@pytest.mark.parametrize("over, exc, text", [
    (dict(sparse_mode=0), RuntimeError, "only sparse_mode 3"),
    (dict(key_index=torch.randn(1, 3, 2, 4)), RuntimeError, "N2index"),
    (dict(key=torch.randn(1, 3, 2, 4, dtype=torch.float16)), RuntimeError, "dtype"),
    (dict(softmax_max=torch.zeros(1, 2, 3)), RuntimeError, "softmax_max must have shape"),
    (dict(weights=torch.randn(1, 3, 3)), RuntimeError, "weights shape"),
    (dict(query_rope=torch.randn(1, 3, 2, 2)), RuntimeError, "together"),
    (dict(layout="BSH"), RuntimeError, "layout"),
    (dict(pre_tokens=1), NotImplementedError, "pre_tokens"),
    (dict(actual_seq_qlen=[2]), NotImplementedError, "actual_seq_qlen"),
])
def test_dense_errors(over, exc, text):
    with pytest.raises(exc, match=text):
        torch_npu.npu_dense_lightning_indexer_grad_kl_loss(**_dense_args(**over))


def test_dense_tnd_needs_lengths():
    a = _dense_args(layout="TND", **{k: v[0] for k, v in _dense_args().items()
                                     if k in ("query", "key", "query_index", "key_index", "weights")})
    a.update(softmax_max=torch.zeros(2, 3, 1), softmax_sum=torch.ones(2, 3, 1), softmax_max_index=torch.zeros(1, 3),
             softmax_sum_index=torch.ones(1, 3))
    with pytest.raises(RuntimeError, match="actual_seq_qlen is required"):
        torch_npu.npu_dense_lightning_indexer_grad_kl_loss(**a)
    with pytest.raises(RuntimeError, match="must end at T=3"):
        torch_npu.npu_dense_lightning_indexer_grad_kl_loss(**a, actual_seq_qlen=[2], actual_seq_klen=[3])
    out = torch_npu.npu_dense_lightning_indexer_grad_kl_loss(**a, actual_seq_qlen=[3], actual_seq_klen=[3])
    assert tuple(out[0].shape) == (3, 2, 4)


@pytest.mark.parametrize("over, exc, text", [
    (dict(sinks=torch.zeros(2)), NotImplementedError, "sinks"),
    (dict(sparse_indices=torch.zeros(1, 3, 1, 2)), RuntimeError, "sparse_indices must be int32"),
    (dict(sparse_indices=torch.zeros(1, 3, 2, 2, dtype=torch.int32)), RuntimeError, "sparse_indices must have shape"),
    (dict(sparse_mode=1), RuntimeError, "only sparse_mode 3"),
])
def test_sparse_errors(over, exc, text):
    with pytest.raises(exc, match=text):
        torch_npu.npu_sparse_lightning_indexer_grad_kl_loss(**_sparse_args(**over))


def test_compiled_graph_computes_the_values():
    """torch.compile traces the op through FakeTensor: the compiled graph must hold the real
    computation (a shape-only fake path would bake zeros in), checked against the float64 loops."""
    case = CASES[1]
    gen = torch.Generator().manual_seed(8)
    t_in, starts, kw = case_inputs(gen, case, torch.float32)
    smax, ssum = (x.float() for x in consistent_main_stats(t_in, case[0], starts, 0.3, case[2]))
    imax, isum = (x.float() for x in index_stats(t_in, case[0], starts))
    op = torch.compile(torch_npu.npu_dense_lightning_indexer_grad_kl_loss, backend="aot_eager", fullgraph=True)
    got = call(op, t_in, "cpu", smax, ssum, imax, isum, 0.3, **kw)
    want = dense_reference(t_in, case[0], starts, smax, ssum, imax, isum, 0.3)
    for g_, w_ in zip(got[:3], want[:3]):
        assert_close(g_, w_, 1e-4, 1e-5)
    assert abs(got[3].item() - want[3]) <= 1e-4 * abs(want[3]) + 1e-6


def test_dense_float32_weights_with_half_inputs():
    """The dense docs allow float32 weights with float16/bfloat16 tensors; d_weights follows weights."""
    case = CASES[0]
    gen = torch.Generator().manual_seed(9)
    t_in, starts, kw = case_inputs(gen, case, torch.float16)
    t_in["weights"] = t_in["weights"].float()
    smax, ssum = (x.float() for x in consistent_main_stats(t_in, case[0], starts, 0.3, case[2]))
    imax, isum = (x.float() for x in index_stats(t_in, case[0], starts))
    got = call(torch_npu.npu_dense_lightning_indexer_grad_kl_loss, t_in, "npu", smax, ssum, imax, isum, 0.3, **kw)
    want = dense_reference(t_in, case[0], starts, smax, ssum, imax, isum, 0.3)
    assert [g_.dtype for g_ in got] == [torch.float16, torch.float16, torch.float32, torch.float32]
    for g_, w_ in zip(got[:3], want[:3]):
        assert_close(g_, w_, 2e-2, 2e-2)
