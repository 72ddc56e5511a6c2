"""torch.compile of the custom ops whose result depends on tensor values (host reads, NMS,
data-dependent sizes, collectives, host-drawn dropout): the compiled call must give the eager
result, never what the kernel used to compute on FakeTensors. Opaque ops must appear as one
node of the AOTAutograd graph; FakeTensor calls give the documented shapes and dtypes."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torch_npu
from torch_npu.op_plugin import _registry


def rand(shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def graph_recorder(graphs, bw_graphs=None):
    """aot_eager that keeps the forward (and backward) graphs it was given."""
    from functorch.compile import make_boxed_func

    def keeper(store):
        def keep(gm, example_inputs):
            store.append(gm)
            return make_boxed_func(gm.forward)
        return keep
    return aot_autograd(fw_compiler=keeper(graphs), bw_compiler=keeper([] if bw_graphs is None else bw_graphs))


def compile_as_node(fn, op, *args):
    """fn compiled in one graph (fullgraph) by aot_eager; asserts ``npu::op`` is one node of the
    AOTAutograd forward graph (not decomposed) and returns the compiled result."""
    graphs = []
    torch._dynamo.reset()  # a fresh trace: no cache entry (or graph break) left by an earlier compile of fn
    out = torch.compile(fn, backend=graph_recorder(graphs), fullgraph=True)(*args)
    target = getattr(torch.ops.npu, op).default
    assert graphs and any(n.target is target for n in graphs[0].graph.nodes), op
    return out


def assert_same(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.device == w.device
        assert torch.equal(g, w)


def test_all_value_dependent_ops_are_opaque():
    assert {"npu_lightning_indexer", "npu_dense_lightning_indexer_softmax_lse", "npu_sparse_flash_attention",
            "npu_recurrent_gated_delta_rule_functional", "npu_nms_v4", "npu_batch_nms", "npu_nms_with_mask",
            "npu_random_choice_with_mask", "npu_rotated_overlaps", "npu_rotated_iou", "npu_roi_align",
            "npu_grouped_matmul_finalize_routing", "npu_alltoallv_gmm", "npu_gmm_alltoallv",
            "npu_alltoallv_quant_gmm", "npu_quant_gmm_alltoallv"} <= _registry.OPAQUE


# ---------------------------------------------------------------- attention (r4)

def indexer_inputs():
    q, k, w = rand((1, 4, 2, 8), 1).npu(), rand((1, 6, 1, 8), 2).npu(), rand((1, 4, 2), 3).npu()
    return q, k, w


def test_lightning_indexer_compiles_to_the_eager_indices():
    q, k, w = indexer_inputs()
    fn = lambda q, k, w: torch_npu.npu_lightning_indexer(q, k, w, sparse_count=3)  # noqa: E731
    eager = fn(q, k, w)
    assert eager[0].dtype == torch.int32 and eager[0].min() >= -1  # real indices, not uninitialised memory
    assert_same(compile_as_node(fn, "npu_lightning_indexer", q, k, w), eager)
    with FakeTensorMode():
        idx, empty = torch_npu.npu_lightning_indexer(torch.empty(2, 5, 8, 16), torch.empty(2, 7, 1, 16),
                                                     torch.empty(2, 5, 8), sparse_count=32)
    assert idx.shape == (2, 5, 1, 32) and idx.dtype == torch.int32 and empty.shape == (0,)


def test_lightning_indexer_inductor():
    q, k, w = indexer_inputs()
    fn = lambda q, k, w: torch_npu.npu_lightning_indexer(q, k, w, sparse_count=4, sparse_mode=0)[0] + 1  # noqa
    assert_same(torch.compile(fn, backend="inductor")(q, k, w), fn(q, k, w))


def test_dense_indexer_softmax_lse_compiles():
    q, k, w = indexer_inputs()
    fn = lambda q, k, w: torch_npu.npu_dense_lightning_indexer_softmax_lse(q, k, w, actual_seq_qlen=[3])  # noqa
    eager = fn(q, k, w)
    assert (eager[1][0, 0, :3] > 0).all() and (eager[1][0, 0, 3:] == 0).all()  # rows past the length hold 0
    assert_same(compile_as_node(fn, "npu_dense_lightning_indexer_softmax_lse", q, k, w), eager)
    with FakeTensorMode():
        m, s = torch_npu.npu_dense_lightning_indexer_softmax_lse(torch.empty(6, 4, 8), torch.empty(9, 2, 8),
                                                                 torch.empty(6, 4), layout="TND")
    assert m.shape == s.shape == (2, 6) and m.dtype == s.dtype == torch.float32


def sfa_inputs():
    q = rand((1, 2, 2, 4), 15).npu().requires_grad_()
    k = rand((1, 5, 1, 4), 16).npu().requires_grad_()
    idx = torch.tensor([[[[0, 3, 4, -1]], [[2, 1, -1, -1]]]], dtype=torch.int32).npu()
    return q, k, idx


@pytest.mark.parametrize("with_lengths", [False, True])
def test_sparse_flash_attention_forward_and_grad(with_lengths):
    q, k, idx = sfa_inputs()
    lens = torch.tensor([4], dtype=torch.int32).npu() if with_lengths else None

    def fn(q, k):
        return torch_npu.npu_sparse_flash_attention(q, k, k, idx, 0.7, actual_seq_lengths_kv=lens,
                                                    return_softmax_lse=True)
    eager = fn(q, k)
    eager[0].sum().backward()
    want_q, want_k = q.grad, k.grad
    q.grad = k.grad = None
    got = torch.compile(fn, backend="aot_eager")(q, k)
    assert_same([t.detach() for t in got], [t.detach() for t in eager])
    got[0].sum().backward()
    torch.testing.assert_close(q.grad, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k.grad, want_k, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        assert_same(compile_as_node(fn, "npu_sparse_flash_attention", q, k), [t.detach() for t in eager])


def test_recomputed_backward_fake_and_double_grad():
    with FakeTensorMode():
        o, m, s = torch_npu.npu_sparse_flash_attention(torch.empty(6, 4, 32), torch.empty(9, 1, 32),
                                                       torch.empty(9, 1, 16), torch.empty(6, 1, 8, dtype=torch.int32),
                                                       0.1, layout_query="TND", layout_kv="TND",
                                                       return_softmax_lse=True)
    assert o.shape == (6, 4, 16) and m.shape == s.shape == (1, 6, 4) and m.dtype == torch.float32
    # the recomputed backward covers keyword-only tensors too (sinks), in float64
    q = rand((1, 2, 2, 4), 20, torch.float64).requires_grad_()
    k = rand((1, 5, 1, 4), 21, torch.float64).requires_grad_()
    sinks = rand((2,), 22, torch.float64).requires_grad_()
    idx = torch.tensor([[[[0, 3, 4, -1]], [[2, 1, -1, -1]]]], dtype=torch.int32)
    fn = lambda a, b, c: torch_npu.npu_sparse_flash_attention(a, b, b, idx, 0.5, sinks=c)[0]  # noqa: E731
    torch.autograd.gradcheck(fn, (q, k, sinks))
    torch.autograd.gradgradcheck(fn, (q, k, sinks))  # create_graph: the recomputed gradient is differentiable
    st = rand((3, 2, 3, 4), 23, torch.float64)
    qd, vd = rand((3, 1, 4), 24, torch.float64).requires_grad_(), rand((3, 2, 3), 25, torch.float64).requires_grad_()
    kd = torch.nn.functional.normalize(rand((3, 1, 4), 26, torch.float64), dim=-1).requires_grad_()
    torch.autograd.gradgradcheck(
        lambda a, b, c: torch_npu.npu_recurrent_gated_delta_rule_functional(a, b, c, st)[0], (qd, kd, vd))


def delta_inputs(seed):
    t, nk, nv, dk, dv = 5, 1, 2, 4, 3
    q = torch.nn.functional.normalize(rand((t, nk, dk), seed), dim=-1).npu()
    k = torch.nn.functional.normalize(rand((t, nk, dk), seed + 1), dim=-1).npu()
    v = rand((t, nv, dv), seed + 2).npu()
    state = rand((t + 1, nv, dv, dk), seed + 3, scale=0.5).npu()
    lens = torch.tensor([2, 3], dtype=torch.int32).npu()
    slots = torch.tensor([4, 0, 1, 5, 2], dtype=torch.int32).npu()
    return q, k, v, state, lens, slots


def test_gated_delta_rule_functional_and_in_place():
    q, k, v, state, lens, slots = delta_inputs(30)
    fn = lambda q, k, v, s, l, i: torch_npu.npu_recurrent_gated_delta_rule_functional(  # noqa: E731
        q, k, v, s, actual_seq_lengths=l, ssm_state_indices=i)
    eager = fn(q, k, v, state, lens, slots)
    assert_same(compile_as_node(fn, "npu_recurrent_gated_delta_rule_functional", q, k, v, state, lens, slots), eager)

    def in_place(q, k, v, s, l, i):
        return torch_npu.npu_recurrent_gated_delta_rule(q, k, v, s, actual_seq_lengths=l, ssm_state_indices=i)
    s_eager, s_comp = state.clone(), state.clone()
    o_eager = in_place(q, k, v, s_eager, lens, slots)
    o_comp = torch.compile(in_place, backend="aot_eager", fullgraph=True)(q, k, v, s_comp, lens, slots)
    assert_same(o_comp, o_eager)
    assert torch.equal(s_comp, s_eager) and not torch.equal(s_comp, state)
    # gradients of the compiled call: the backward recomputes the kernel (eager fallback for host reads)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    fn(qg, kg, vg, state, lens, slots)[0].sum().backward()
    want = [t.grad for t in (qg, kg, vg)]
    for t in (qg, kg, vg):
        t.grad = None
    torch.compile(fn, backend="aot_eager")(qg, kg, vg, state, lens, slots)[0].sum().backward()
    for t, w in zip((qg, kg, vg), want):
        torch.testing.assert_close(t.grad, w, rtol=1e-6, atol=1e-6)
    with FakeTensorMode():
        o, s = torch_npu.npu_recurrent_gated_delta_rule_functional(
            torch.empty(5, 2, 8), torch.empty(5, 2, 8), torch.empty(5, 4, 6, dtype=torch.bfloat16),
            torch.empty(9, 4, 6, 8), actual_seq_lengths=torch.empty(2, dtype=torch.int32))
    assert o.shape == (5, 4, 6) and o.dtype == torch.bfloat16 and s.shape == (9, 4, 6, 8) and s.dtype == torch.float32


# ---------------------------------------------------------------- NMS, random choice, boxes

def nms_boxes(n, seed):
    g = torch.Generator().manual_seed(seed)
    lo = torch.rand(n, 2, generator=g) * 20
    return torch.cat([lo, lo + 2 + torch.rand(n, 2, generator=g) * 8], 1), torch.rand(n, generator=g)


@pytest.mark.parametrize("pad", [True, False])
def test_nms_v4_padded_and_data_dependent_size(pad):
    boxes, scores = nms_boxes(12, 1)
    args = (boxes.npu(), scores.npu(), torch.tensor(0.3).npu(), torch.tensor(0.2).npu())
    fn = lambda b, s, i, t: torch_npu.npu_nms_v4(b, s, 8, i, t, pad_to_max_output_size=pad)  # noqa: E731
    eager = fn(*args)
    assert 0 < int(eager[1]) < 8 and eager[0].shape == ((8,) if pad else (int(eager[1]),))
    if pad:
        assert_same(compile_as_node(fn, "npu_nms_v4", *args), eager)
        assert_same(torch.compile(fn, backend="inductor")(*args), eager)
    else:  # an unbacked output size: Dynamo needs capture_dynamic_output_shape_ops for fullgraph
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            assert_same(compile_as_node(fn, "npu_nms_v4", *args), eager)
    with FakeTensorMode(shape_env=ShapeEnv()):
        idx, count = torch_npu.npu_nms_v4(torch.empty(12, 4), torch.empty(12), 8, torch.tensor(0.3),
                                          torch.tensor(0.2), pad_to_max_output_size=pad)
        assert idx.dtype == count.dtype == torch.int32 and count.shape == ()
        assert idx.shape == (8,) if pad else isinstance(idx.shape[0], torch.SymInt)


def test_batch_nms_and_nms_with_mask():
    boxes, scores = nms_boxes(10, 2)
    b4 = boxes.reshape(1, 10, 1, 4).npu()
    cls_scores = torch.stack([scores, scores.flip(0)], 1).reshape(1, 10, 2).npu()
    fn = lambda b, s: torch_npu.npu_batch_nms(b, s, 0.1, 0.4, 4, 6)  # noqa: E731
    eager = fn(b4, cls_scores)
    assert int(eager[3][0]) > 0
    assert_same(compile_as_node(fn, "npu_batch_nms", b4, cls_scores), eager)
    order = scores.argsort(descending=True)
    proposals = torch.cat([boxes[order], scores[order, None]], 1).npu()
    fn2 = lambda p: torch_npu.npu_nms_with_mask(p, 0.3)  # noqa: E731
    eager2 = fn2(proposals)
    assert 0 < int(eager2[2].sum()) < 10
    assert_same(compile_as_node(fn2, "npu_nms_with_mask", proposals), eager2)
    with FakeTensorMode():
        out = torch_npu.npu_batch_nms(torch.empty(2, 7, 1, 4, dtype=torch.float16),
                                      torch.empty(2, 7, 3, dtype=torch.float16), 0.1, 0.5, 3, 5)
        mask_out = torch_npu.npu_nms_with_mask(torch.empty(9, 8), 0.5)
    assert [tuple(t.shape) for t in out] == [(2, 5, 4), (2, 5), (2, 5), (2,)]
    assert [t.dtype for t in out] == [torch.float16] * 3 + [torch.int32]
    assert [tuple(t.shape) for t in mask_out] == [(9, 5), (9,), (9,)]
    assert [t.dtype for t in mask_out] == [torch.float32, torch.int32, torch.uint8]
    with pytest.raises(RuntimeError, match="does not require grad"):  # no backward, as the real op
        torch_npu.npu_nms_with_mask(proposals.clone().requires_grad_(), 0.3)[0].sum().backward()


@pytest.mark.parametrize("count", [4, 0])
def test_random_choice_with_mask(count):
    x = (rand((3, 5), 4) > 0).npu()
    fn = lambda x: torch_npu.npu_random_choice_with_mask(x, count, 1, 2)  # noqa: E731 (fixed seeds)
    eager = fn(x)
    rows = count or int(x.sum())
    assert eager[0].shape == (rows, 2) and bool(x[tuple(eager[0][eager[1]].long().t())].all())
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        assert_same(compile_as_node(fn, "npu_random_choice_with_mask", x), eager)
    with FakeTensorMode(shape_env=ShapeEnv()):
        y, mask = torch_npu.npu_random_choice_with_mask(torch.empty(3, 4, 5, dtype=torch.bool), count)
    assert y.dtype == torch.int32 and mask.dtype == torch.bool and y.shape[1] == 3
    assert (y.shape[0] == count) if count else isinstance(y.shape[0], torch.SymInt)


def test_rotated_overlaps_and_iou():
    g = torch.Generator().manual_seed(5)
    boxes = torch.cat([torch.rand(1, 3, 2, generator=g) * 10, 2 + torch.rand(1, 3, 2, generator=g) * 4,
                       torch.rand(1, 3, 1, generator=g) * 90], -1).npu()
    query = torch.cat([torch.rand(1, 4, 2, generator=g) * 10, 2 + torch.rand(1, 4, 2, generator=g) * 4,
                       torch.rand(1, 4, 1, generator=g) * 90], -1).npu()
    for name in ("npu_rotated_overlaps", "npu_rotated_iou"):
        fn = getattr(torch_npu, name)
        eager = fn(boxes, query)
        assert eager.shape == (1, 3, 4) and eager.abs().sum() > 0
        assert_same(compile_as_node(fn, name, boxes, query), eager)
        with FakeTensorMode():
            out = fn(torch.empty(2, 3, 5, dtype=torch.float16), torch.empty(2, 6, 5, dtype=torch.float16))
        assert out.shape == (2, 3, 6) and out.dtype == torch.float16


def test_roi_align_forward_grad_and_inductor():
    feat = rand((2, 3, 7, 8), 6).npu().requires_grad_()
    rois = torch.tensor([[0, 1.0, 2.0, 20.0, 14.0], [1, -6.0, -3.0, 9.0, 30.0]]).npu()
    fn = lambda f, r: torch_npu.npu_roi_align(f, r, 0.5, 3, 2, 2, 0)  # noqa: E731
    eager = fn(feat, rois)
    eager.pow(2).sum().backward()
    want = feat.grad
    feat.grad = None
    fw, bw = [], []  # training compiles to one graph each way: npu_roi_align forward, npu_roi_alignbk backward
    got = torch.compile(fn, backend=graph_recorder(fw, bw), fullgraph=True)(feat, rois)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    got.pow(2).sum().backward()
    torch.testing.assert_close(feat.grad, want, rtol=1e-6, atol=1e-6)
    assert any(n.target is torch.ops.npu.npu_roi_align.default for n in fw[0].graph.nodes)
    assert any(n.target is torch.ops.npu.npu_roi_alignbk.default for n in bw[0].graph.nodes)
    with torch.no_grad():
        assert_same(compile_as_node(fn, "npu_roi_align", feat, rois), eager.detach())
        torch.testing.assert_close(torch.compile(fn, backend="inductor")(feat, rois), eager.detach(),
                                   rtol=0, atol=0)
    with FakeTensorMode():
        out = torch_npu.npu_roi_align(torch.empty(2, 4, 9, 9, dtype=torch.float16), torch.empty(5, 5), 0.5, 3, 3, 2, 1)
    assert out.shape == (5, 4, 3, 3) and out.dtype == torch.float16


# ---------------------------------------------------------------- MoE routing, AlltoAllv (one rank)

def test_grouped_matmul_finalize_routing():
    g = torch.Generator().manual_seed(8)
    m, k, n, e = 6, 8, 4, 3
    x = torch.randint(-5, 6, (m, k), generator=g, dtype=torch.int8).npu()
    w = torch.randint(-5, 6, (e, k, n), generator=g, dtype=torch.int8).npu()
    group_list = torch.tensor([2, 1, 3]).npu()
    row_index = torch.tensor([3, 0, 1, 2, 0, 3]).npu()
    scale, logit = torch.rand(e, n, generator=g).npu(), torch.rand(m, generator=g).npu()

    def fn(x, w, gl, r, s, lg):
        return torch_npu.npu_grouped_matmul_finalize_routing(x, w, gl, scale=s, logit=lg, row_index=r, output_bs=4)
    eager = fn(x, w, group_list, row_index, scale, logit)
    assert eager.shape == (4, n) and eager.abs().sum() > 0
    assert_same(compile_as_node(fn, "npu_grouped_matmul_finalize_routing", x, w, group_list, row_index, scale,
                                logit), eager)
    with FakeTensorMode():
        out = torch_npu.npu_grouped_matmul_finalize_routing(
            torch.empty(6, 8, dtype=torch.int8), torch.empty(3, 8, 5, dtype=torch.int8),
            torch.empty(3, dtype=torch.int64), row_index=torch.empty(6, dtype=torch.int64))
    assert out.shape == (6, 5) and out.dtype == torch.float32


def test_alltoallv_gmm_one_rank_forward_and_grad():
    x = rand((5, 6), 9).npu().requires_grad_()
    w = rand((2, 6, 4), 10).npu().requires_grad_()

    def fn(x, w):
        return torch_npu.npu_alltoallv_gmm(x, w, "g", 1, [2, 3], [2, 3], permute_out_flag=True)
    eager = fn(x, w)
    eager[0].pow(2).sum().backward()
    want = (x.grad, w.grad)
    x.grad = w.grad = None
    got = torch.compile(fn, backend="aot_eager")(x, w)
    assert_same([t.detach() for t in got], [t.detach() for t in eager])
    got[0].pow(2).sum().backward()
    torch.testing.assert_close((x.grad, w.grad), want, rtol=1e-6, atol=1e-6)
    fn2 = lambda x, w: torch_npu.npu_gmm_alltoallv(x, w, "g", 1, [2, 3], [2, 3])  # noqa: E731
    with torch.no_grad():
        assert_same(compile_as_node(fn2, "npu_gmm_alltoallv", x, w), fn2(x, w))
        assert_same(compile_as_node(fn, "npu_alltoallv_gmm", x, w), [t.detach() for t in eager])
    with FakeTensorMode():  # 4 ranks x 2 experts: A = sum(recv_counts) rows, no group consulted
        x16, w16 = torch.empty(5, 6, dtype=torch.float16), torch.empty(2, 6, 4, dtype=torch.float16)
        y, mm_y, perm = torch_npu.npu_alltoallv_gmm(x16, w16, "g", 4, [1] * 5 + [0] * 3, [2] * 8,
                                                    mm_x=torch.empty(3, 7, dtype=torch.float16),
                                                    mm_weight=torch.empty(7, 2, dtype=torch.float16),
                                                    permute_out_flag=True)
        z, _ = torch_npu.npu_gmm_alltoallv(x16, w16, "g", 4, [1] * 5 + [0] * 3, [3] * 8)
    assert y.shape == (16, 4) and perm.shape == (16, 6) and mm_y.shape == (3, 2) and z.shape == (24, 4)
    assert y.dtype == perm.dtype == mm_y.dtype == z.dtype == torch.float16


def test_alltoallv_quant_gmm_one_rank():
    g = torch.Generator().manual_seed(11)
    e8 = torch.float8_e8m0fnu
    x = (torch.randn(5, 64, generator=g)).to(torch.float8_e4m3fn).npu()
    w = (torch.randn(2, 64, 3, generator=g)).to(torch.float8_e4m3fn).npu()
    sx = torch.randint(124, 131, (5, 1, 2), generator=g, dtype=torch.uint8).view(e8).npu()
    sw = torch.randint(124, 131, (2, 1, 3, 2), generator=g, dtype=torch.uint8).view(e8).npu()
    for name, extra in (("npu_alltoallv_quant_gmm", dict(permute_out_flag=True)), ("npu_quant_gmm_alltoallv", {})):
        def fn(x, w, sx, sw, name=name, extra=extra):
            return getattr(torch_npu, name)(x, w, sx, sw, "", 1, [3, 2], [3, 2], torch.float16, **extra)
        eager = fn(x, w, sx, sw)
        assert eager[0].shape == (5, 3) and eager[0].dtype == torch.float16 and eager[0].abs().sum() > 0
        got = compile_as_node(fn, name, x, w, sx, sw)
        assert_same(got[0], eager[0])
        if name == "npu_alltoallv_quant_gmm":
            assert torch.equal(got[2].view(torch.uint8), eager[2].view(torch.uint8))
        with FakeTensorMode():
            out = fn(torch.empty(5, 64, dtype=torch.float8_e4m3fn), torch.empty(2, 64, 3, dtype=torch.float8_e4m3fn),
                     torch.empty(5, 1, 2, dtype=e8), torch.empty(2, 1, 3, 2, dtype=e8))
        assert out[0].shape == (5, 3) and out[0].dtype == torch.float16
        if name == "npu_alltoallv_quant_gmm":
            assert out[2].shape == (5, 64) and out[2].dtype == torch.float8_e4m3fn


# ---------------------------------------------------------------- verified: traced math stays correct

def test_comm_matmul_one_rank_traces_its_math():
    x1, x2, bias = rand((4, 3), 12).npu(), rand((3, 5), 13).npu(), rand((5,), 14).npu()
    fn = lambda a, b, c: (torch_npu.npu_mm_all_reduce_base(a, b, "g", bias=c),  # noqa: E731
                          torch_npu.npu_mm_reduce_scatter_base(a, b, "g", 1, bias=c),
                          torch_npu.npu_all_gather_base_mm(a, b, "g", 1, bias=c))
    eager = fn(x1, x2, bias)
    got = torch.compile(fn, backend="aot_eager", fullgraph=True)(x1, x2, bias)
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(eager)):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_comm_matmul_multi_rank_shapes_but_no_graph(monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch_npu.op_plugin.comm import matmul_collectives as comm_matmul
    # a stand-in two-rank group: shape inference answers, but the collective must not be
    # silently left out of a graph being built
    monkeypatch.setattr(comm_matmul, "_group", lambda op, hcom: object())
    monkeypatch.setattr(comm_matmul.dist, "get_world_size", lambda group=None: 2)
    calls = [lambda a, b: torch_npu.npu_mm_all_reduce_base(a, b, "g"),
             lambda a, b: torch_npu.npu_mm_reduce_scatter_base(a, b, "g", 2),
             lambda a, b: torch_npu.npu_all_gather_base_mm(a, b, "g", 2)[0]]
    with FakeTensorMode():
        shapes = [tuple(call(torch.empty(4, 3), torch.empty(3, 5)).shape) for call in calls]
    assert shapes == [(4, 5), (2, 5), (8, 5)]
    for call in calls:
        with pytest.raises(NotImplementedError, match="multi-rank"):
            make_fx(call, tracing_mode="fake")(torch.empty(4, 3), torch.empty(3, 5))


def test_kv_cache_ops_mutate_as_eager():
    g = torch.Generator().manual_seed(15)
    key, value = rand((4, 2, 3), 16).npu(), rand((4, 2, 5), 17).npu()
    kc, vc = torch.zeros(3, 4, 2, 3).npu(), torch.zeros(3, 4, 2, 5).npu()
    slots = torch.tensor([5, 0, 11, 7], dtype=torch.int32).npu()
    fn = lambda k, v, kc, vc, s: torch_npu.npu_scatter_pa_kv_cache(k, v, kc, vc, s)  # noqa: E731
    want_k, want_v = kc.clone(), vc.clone()
    fn(key, value, want_k, want_v, slots)
    torch.compile(fn, backend="aot_eager", fullgraph=True)(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v) and kc.abs().sum() > 0
    bufs = [torch.randint(1, 30, (6,), generator=g).npu() for _ in range(4)]
    sampled = torch.randint(1, 100, (4, 1), generator=g).npu()
    tables = torch.randint(1, 50, (6, 9), generator=g).npu()
    step = lambda a, b, c, d: torch_npu.npu_advance_step_flashattn(a, sampled, b, c, d, tables, 6, 4, 4)  # noqa
    want = [t.clone() for t in bufs]
    step(*want)
    torch.compile(step, backend="aot_eager", fullgraph=True)(*bufs)
    for got_t, want_t in zip(bufs, want):
        assert torch.equal(got_t, want_t)


def test_fusion_attention_dropout_runs_eagerly_never_without_dropout():
    q = rand((1, 4, 2, 8), 18).npu().requires_grad_()
    drop = lambda q: torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", keep_prob=0.5)[0] * 2  # noqa: E731
    torch.npu.manual_seed(3)
    eager = drop(q)
    eager.sum().backward()
    want, q.grad = q.grad, None
    assert bool((eager == 0).any())  # dropout happened
    torch._dynamo.reset()
    torch.npu.manual_seed(3)  # a graph break: the call runs eagerly, same generator draw, same mask
    got = torch.compile(drop, backend="aot_eager")(q)
    got.sum().backward()
    assert torch.equal(got, eager) and torch.equal(q.grad, want)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="NotImplementedError|attention dropout"):
        torch.compile(drop, backend="aot_eager", fullgraph=True)(q)
    from torch.fx.experimental.proxy_tensor import make_fx
    with pytest.raises(NotImplementedError, match="attention dropout"):
        make_fx(drop)(q.detach())
    plain = lambda q: torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", scale=0.3)[0]  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(plain, backend="aot_eager", fullgraph=True)(q), plain(q),
                                   rtol=1e-6, atol=1e-6)
    with FakeTensorMode():  # shape inference alone still answers
        out = torch_npu.npu_fusion_attention(torch.empty(1, 4, 2, 8), torch.empty(1, 4, 2, 8),
                                             torch.empty(1, 4, 2, 8), 2, "BSND", keep_prob=0.5)[0]
    assert out.shape == (1, 4, 2, 8)
