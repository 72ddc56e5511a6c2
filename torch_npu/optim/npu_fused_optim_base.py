"""Base class of the fused ``torch_npu.optim`` optimizers.

On the first ``step()`` the parameters (and their gradients) of all param
groups are moved into one flat, contiguous buffer per (device, dtype); each
parameter's ``.data`` is re-pointed (``set_``) at its slice of that buffer and
each ``.grad`` becomes a view of the matching flat gradient buffer.  The
optimizer states are combined the same way (one flat buffer per state per
segment).  An update is then a handful of big element-wise ops on the flat
buffers instead of a Python loop of small ops per parameter, and ``zero_grad``
is one ``zero_()`` per dtype.

A *segment* is the run of parameters of one param group that share device,
dtype and step counter (``state['step']``): all of them are updated by the
same vector ops with the same scalar hyper-parameters.  A group normally has
one segment per dtype; parameters whose gradient first appears later get their
own segment (their bias corrections differ), exactly like torch.optim treats
them per parameter.

The layout is rebuilt when the set of parameters that have a gradient
changes, when a parameter's storage is replaced behind the optimizer's back
(``p.data = ...``, ``module.to(...)``), or after ``load_state_dict``.
Gradients replaced by the user (``model.zero_grad(set_to_none=True)`` followed
by ``backward``) are copied back into the flat buffer at the next step.
"""
import torch
from torch import inf
from torch.optim.optimizer import Optimizer

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["NpuFusedOptimizerBase"]


def _dense_strides(t):
    """Strides that keep ``t``'s memory layout when it is non-overlapping and
    dense (e.g. channels_last); contiguous strides otherwise."""
    expected = 1
    dense = True
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            dense = False
            break
        expected *= size
    if dense:
        return tuple(t.stride())
    strides, acc = [], 1
    for s in reversed(t.shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


class _Segment:
    """Params of one group / device / dtype / step counter: a contiguous slice
    ``[start, end)`` of the flat buffers of their (device, dtype)."""

    __slots__ = ("group_index", "bucket", "params", "shapes", "strides", "offsets",
                 "numels", "start", "end", "param", "grad", "grad_views", "state",
                 "step", "fresh", "_numels_t", "extra")

    def __init__(self, group_index, bucket, params):
        self.group_index = group_index
        self.bucket = bucket
        self.params = params
        self.shapes = [tuple(p.shape) for p in params]
        self.strides = [_dense_strides(p) for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = []
        self.start = self.end = 0
        self.param = self.grad = None
        self.grad_views = []
        self.state = {}
        self.step = 0
        self.fresh = True
        self._numels_t = None
        self.extra = {}

    def views(self, flat):
        """Per-parameter views (param shapes/strides) of a segment-sized flat tensor."""
        base = flat.storage_offset()
        return [flat.as_strided(shape, stride, base + off - self.start)
                for shape, stride, off in zip(self.shapes, self.strides, self.offsets)]

    def expand(self, per_param):
        """Spread a per-parameter vector (one value per param) over the segment."""
        if self._numels_t is None or self._numels_t.device != per_param.device:
            self._numels_t = torch.tensor(self.numels, dtype=torch.long, device=per_param.device)
        return per_param.repeat_interleave(self._numels_t, output_size=self.end - self.start)


class _Bucket:
    """Flat param / grad buffers for all params of one (device, dtype)."""

    __slots__ = ("device", "dtype", "param", "grad", "segments")

    def __init__(self, device, dtype):
        self.device = device
        self.dtype = dtype
        self.param = None
        self.grad = None
        self.segments = []


_DTYPE_SLOT = {torch.float32: 0, torch.float16: 1}


class NpuFusedOptimizerBase(Optimizer):
    """Base class of the NPU fused optimizers (see module docstring).

    Subclasses implement ``_segment_step(group, seg)`` (the math on the flat
    buffers ``seg.param``, ``seg.grad`` and ``seg.state[name]``) and
    ``_state_spec(group)`` (``{state name: initial fill value}``).
    """

    # Whether ``state['step']`` is kept (an int, as in the real torch_npu).
    _has_step = True
    # Optimizer-level attributes (not in param groups) kept by pickle / deepcopy.
    _extra_state_attrs = ("is_fused_optimizer",)

    def __init__(self, params, default):
        super().__init__(params, default)
        self.is_fused_optimizer = True
        self._invalidate()
        self.combined_params_indexed_by_group = None
        self.combined_grads_indexed_by_group = None
        self.combined_param_states_indexed_by_group = None
        self.params_lists_indexed_by_group = []
        self.params_all_group = [[], []]

    # ------------------------------------------------------------------ state
    def __getstate__(self):
        # torch keeps only defaults / state / param_groups; keep the
        # optimizer-level options too (copy.deepcopy, pickle).  The combined
        # buffers are rebuilt on the next step.
        state = super().__getstate__()
        for k in self._extra_state_attrs:
            if k in self.__dict__:
                state[k] = self.__dict__[k]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("is_fused_optimizer", True)
        for k in ("combined_params_indexed_by_group", "combined_grads_indexed_by_group",
                  "combined_param_states_indexed_by_group"):
            self.__dict__.setdefault(k, None)
        self.__dict__.setdefault("params_lists_indexed_by_group", [])
        self.__dict__.setdefault("params_all_group", [[], []])
        self._invalidate()

    def _invalidate(self):
        self._buckets = []
        self._slots = []
        self._segments = []
        self._signature = None
        self._expected_ptrs = []
        self._owned_grads = {}
        self.is_params_grads_combined = False
        self.is_states_combined = False
        self.is_grads_masks_combined = False

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # torch only casts the loaded tensors (``.to`` returns the very same
        # tensor when dtype/device match): copy them so that this optimizer
        # never aliases the buffers of the optimizer the state came from.
        for st in self.state.values():
            for k, v in list(st.items()):
                if isinstance(v, torch.Tensor):
                    st[k] = v.detach().clone()
        self._invalidate()

    def _param_step(self, p):
        st = self.state.get(p)
        if not st or "step" not in st:
            return 0
        step = st["step"]
        if isinstance(step, torch.Tensor):
            step = int(step.item())
        return int(step)

    def _segment_key(self, p):
        """Params of one group with equal keys are updated together."""
        return self._param_step(p) if self._has_step else None

    def _state_spec(self, group):
        raise NotImplementedError

    def _segment_step(self, group, seg):
        raise NotImplementedError

    # ----------------------------------------------------------------- layout
    def _current_signature(self):
        sig = []
        for group in self.param_groups:
            sig.append(tuple(id(p) for p in group["params"] if p.grad is not None))
        return tuple(sig)

    def _check_param(self, p):
        if p.grad.is_sparse:
            raise RuntimeError("{} does not support sparse gradients".format(type(self).__name__)
                               + pta_error(ErrCode.NOT_SUPPORT))
        if not p.is_floating_point():
            raise TypeError("Fused optimizer's parameters must be floating point tensors, but received {}"
                            .format(p.dtype) + pta_error(ErrCode.TYPE))
        if p.grad.shape != p.shape:
            raise RuntimeError("grad shape {} does not match param shape {}".format(
                tuple(p.grad.shape), tuple(p.shape)) + pta_error(ErrCode.PARAM))

    @torch.no_grad()
    def _build_layout(self):
        self._invalidate()
        buckets = {}
        for gi, group in enumerate(self.param_groups):
            segs = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                self._check_param(p)
                bkey = (p.device, p.dtype)
                segs.setdefault((bkey, self._segment_key(p)), []).append(p)
            for (bkey, _), params in segs.items():
                if bkey not in buckets:
                    buckets[bkey] = _Bucket(*bkey)
                buckets[bkey].segments.append(_Segment(gi, buckets[bkey], params))

        # float32 first, float16 second (the real API's [fp32, fp16] order), others after.
        ordered = sorted(buckets.values(),
                         key=lambda b: (_DTYPE_SLOT.get(b.dtype, 2), str(b.device), str(b.dtype)))
        slots, taken, extra = [], set(), 2
        for b in ordered:
            s = _DTYPE_SLOT.get(b.dtype)
            if s is None or s in taken:
                s, extra = extra, extra + 1
            taken.add(s)
            slots.append(s)

        owned = {}
        for bucket in ordered:
            total = sum(sum(s.numels) for s in bucket.segments)
            flat_p = torch.empty(total, dtype=bucket.dtype, device=bucket.device)
            flat_g = torch.zeros(total, dtype=bucket.dtype, device=bucket.device)
            storage = flat_p.untyped_storage()
            off = 0
            for seg in bucket.segments:
                seg.start = off
                for p, shape, stride, n in zip(seg.params, seg.shapes, seg.strides, seg.numels):
                    seg.offsets.append(off)
                    flat_p.as_strided(shape, stride, off).copy_(p.detach())
                    gview = flat_g.as_strided(shape, stride, off)
                    gview.copy_(p.grad.detach())
                    # the param now lives in the combined buffer
                    p.set_(storage, off, shape, stride)
                    p.grad = gview
                    seg.grad_views.append(gview)
                    owned[id(p)] = gview
                    off += n
                seg.end = off
                seg.param = flat_p[seg.start:seg.end]
                seg.grad = flat_g[seg.start:seg.end]
                seg.step = self._param_step(seg.params[0]) if self._has_step else 0
            bucket.param = flat_p
            bucket.grad = flat_g

        self._buckets = ordered
        self._slots = slots
        self._segments = sorted((s for b in ordered for s in b.segments), key=lambda s: s.group_index)
        self._owned_grads = owned
        self._signature = self._current_signature()
        self._expected_ptrs = [(p, p.data_ptr()) for s in self._segments for p in s.params]
        self._fill_compat_views()
        self.is_params_grads_combined = bool(ordered)

    def _fill_compat_views(self):
        """The real implementation's bookkeeping attributes: per group, per
        dtype slot, the group's slice of the combined buffers."""
        nslots = max([2] + [s + 1 for s in self._slots])
        ngroups = len(self.param_groups)
        self.combined_params_indexed_by_group = [[None] * nslots for _ in range(ngroups)]
        self.combined_grads_indexed_by_group = [[None] * nslots for _ in range(ngroups)]
        self.params_lists_indexed_by_group = [[[] for _ in range(nslots)] for _ in range(ngroups)]
        self.params_all_group = [[] for _ in range(nslots)]
        for bucket, slot in zip(self._buckets, self._slots):
            span = {}
            for seg in bucket.segments:
                lo, hi = span.get(seg.group_index, (seg.start, seg.end))
                span[seg.group_index] = (min(lo, seg.start), max(hi, seg.end))
                self.params_lists_indexed_by_group[seg.group_index][slot].extend(seg.params)
                self.params_all_group[slot].extend(seg.params)
            for gi, (lo, hi) in span.items():
                self.combined_params_indexed_by_group[gi][slot] = bucket.param[lo:hi]
                self.combined_grads_indexed_by_group[gi][slot] = bucket.grad[lo:hi]

    @torch.no_grad()
    def _sync_params_and_grads(self):
        """Make sure the flat layout matches the params that currently have a
        gradient and that every ``p.grad`` lives in the flat grad buffer."""
        if self._signature is None or self._current_signature() != self._signature:
            self._build_layout()
            return
        for p, ptr in self._expected_ptrs:
            if p.data_ptr() != ptr or p.grad.shape != p.shape:
                self._build_layout()
                return
        for seg in self._segments:
            for p, gview in zip(seg.params, seg.grad_views):
                g = p.grad
                if g is not gview:
                    # the user replaced the gradient: bring it back into the buffer
                    if g.is_sparse:
                        raise RuntimeError("{} does not support sparse gradients".format(type(self).__name__)
                                           + pta_error(ErrCode.NOT_SUPPORT))
                    gview.copy_(g.detach())
                    p.grad = gview

    @torch.no_grad()
    def _build_states(self):
        for seg in self._segments:
            group = self.param_groups[seg.group_index]
            self._combine_segment_states(seg, self._state_spec(group))
        self.combined_param_states_indexed_by_group = [
            [s.state for s in self._segments if s.group_index == gi] for gi in range(len(self.param_groups))]
        self.is_states_combined = bool(self._segments)

    def _combine_segment_states(self, seg, spec):
        """(Re)build the flat state buffers of a segment for the state names in
        ``spec`` ({name: init fill value}), keeping the values already held in
        ``self.state[p]``."""
        n = seg.end - seg.start
        dtype, device = seg.bucket.dtype, seg.bucket.device
        old = seg.state
        seg.state = {}
        seg.fresh = False
        for name, init in spec.items():
            if name in old and old[name].numel() == n:
                seg.state[name] = old[name]
                continue
            flat = torch.full((n,), init, dtype=dtype, device=device)
            views = seg.views(flat)
            for p, view in zip(seg.params, views):
                st = self.state[p]
                if name in st and isinstance(st[name], torch.Tensor):
                    view.copy_(st[name].detach().reshape(view.shape))
                else:
                    seg.fresh = True
                st[name] = view
            seg.state[name] = flat
        if self._has_step:
            for p in seg.params:
                self.state[p]["step"] = seg.step
        seg.extra = {}

    def _ensure_states(self):
        if not self.is_states_combined:
            self._build_states()
            return
        for seg in self._segments:
            spec = self._state_spec(self.param_groups[seg.group_index])
            if any(name not in seg.state for name in spec):
                self._combine_segment_states(seg, spec)

    def _maybe_init_combined_params_and_grads(self):
        self._sync_params_and_grads()

    def _maybe_init_combined_states(self):
        self._ensure_states()

    def _sync_step_counters(self, seg):
        if self._has_step:
            for p in seg.params:
                self.state[p]["step"] = seg.step

    # ------------------------------------------------------------------- API
    def _prepare(self):
        self._sync_params_and_grads()
        if not self._segments:
            return False
        self._ensure_states()
        return True

    def _run_segments(self):
        for seg in self._segments:
            self._segment_step(self.param_groups[seg.group_index], seg)
            self._sync_step_counters(seg)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._prepare():
            self._run_segments()
        return loss

    @torch.no_grad()
    def zero_grad(self, set_to_none=False):
        if set_to_none:
            raise ValueError("set_to_none is not supported in fused optimizers" + pta_error(ErrCode.VALUE))
        owned = self._owned_grads
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None or owned.get(id(p)) is g:
                    continue
                if g.grad_fn is not None:
                    g.detach_()
                else:
                    g.requires_grad_(False)
                g.zero_()
        for bucket in self._buckets:
            bucket.grad.zero_()

    def _combined_list(self, attr):
        out = [None, None]
        for bucket, slot in zip(self._buckets, self._slots):
            out.extend([None] * (slot + 1 - len(out)))
            out[slot] = getattr(bucket, attr)
        return out

    def get_combined_params(self):
        """Flat parameter buffers: ``[float32, float16, *others]`` (None where absent)."""
        return self._combined_list("param")

    def get_combined_grads(self):
        """Flat gradient buffers, same order as ``get_combined_params()``."""
        return self._combined_list("grad")

    @property
    def params_all_group_combined(self):
        return self.get_combined_params()

    @property
    def grads_all_group_combined(self):
        return self.get_combined_grads()

    @staticmethod
    def _total_norm(grads, norm_type):
        grads = [g for g in grads if g is not None and g.numel() > 0]
        if not grads:
            return None
        device = grads[0].device
        if norm_type == inf:
            norms = [g.detach().abs().max().float().to(device) for g in grads]
            return torch.stack(norms).max()
        norms = [torch.linalg.vector_norm(g.detach(), norm_type, dtype=torch.float32).to(device) for g in grads]
        if len(norms) == 1:
            return norms[0]
        return torch.linalg.vector_norm(torch.stack(norms), norm_type)

    @torch.no_grad()
    def clip_grad_norm_fused_(self, max_norm, norm_type=2):
        """Clip the gradients of all params (with a gradient) in place so that
        their total ``norm_type``-norm is at most ``max_norm``; returns the
        total norm before clipping (like ``torch.nn.utils.clip_grad_norm_``)."""
        self._sync_params_and_grads()
        max_norm = float(max_norm)
        norm_type = float(norm_type)
        grads = [b.grad for b in self._buckets]
        total_norm = self._total_norm(grads, norm_type)
        if total_norm is None:
            return torch.tensor(0.)
        clip_coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(clip_coef.to(device=g.device, dtype=g.dtype))
        return total_norm
