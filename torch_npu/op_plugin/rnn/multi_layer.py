"""The multi-layer RNN entry points ``_lstm_npu`` / ``_gru_npu`` (aclnnLSTM / aclnnGRU) with their
``*_backward`` ops, and the single-layer DynamicGRUV2 op ``npu_gru`` with ``npu_gru_backward``.

Layouts, as op-plugin's op_api adapters build the calls (``LstmKernelNpuOpApi.cpp``,
``LSTMBackwardKernelNpuOpApi.cpp``, ``GruKernelNpuOpApi.cpp``, ``GRUBackwardKernelNpuOpApi.cpp``;
``at::lstm`` / ``at::gru`` hand them nn.LSTM / nn.GRU's own arguments):

* ``input [T, B, I]`` (time major), ``params`` = nn.LSTM / nn.GRU ``_flat_weights``: per layer,
  per direction ``w_ih [G*H, I_l], w_hh [G*H, H]`` (+ ``b_ih, b_hh [G*H]`` when has_biases),
  G = 4 (gates i, f, g, o) or 3 (r, z, n). Layer l > 0 reads the previous layer's output
  (both directions concatenated, I_l = D*H). ``hx`` = ``[h0, c0]`` (LSTM) or ``h0`` (GRU), each
  ``[L*D, B, H]``, index l*D + d.
* ``_lstm_npu`` returns ``(y [T, B, D*H], hy, cy [L*D, B, H], i, j, f, o, h, c, tanhc)``;
  ``_gru_npu`` returns ``(y, hy, r, z, n, h_n, h)``. Each per-step output is the per-(layer,
  direction) ``[T, B, H]`` tensors stacked on dim 0: ``[L*D, T, B, H]`` (the backward adapters
  chunk them back into L*D tensors of ``[T, B, H]``). With ``train=False`` the adapters allocate
  no gate lists: those outputs are undefined (None); ``_lstm_npu``'s h and c are always given.
  ``h_n`` is the hidden half of the new gate, ``W_hn h_{t-1} + b_hn`` (DynamicGRUV2's
  ``hidden_new``, which the TBE kernel stores from the same matmul).
* The reverse direction runs from t = T-1 to 0 and stores each step at its own time index (as
  DynamicRNN's REDIRECTIONAL mode and op-plugin's flip-based bidirectional path do), so its final
  state is step 0.

``npu_gru`` (DynamicGRUV2, ``GruKernelNpu.cpp``): ``input [T, B, I]``, ``hx [B, H]`` or
``[1, B, H]``, ``weight_input [I, 3H]`` / ``weight_hidden [H, 3H]`` (the transposed nn.GRU
weights, gate_order "rzh"), ``bias_input``/``bias_hidden [3H]``; reset_after=True (nn.GRU's
formula). Outputs ``y, output_h, update (z), reset (r), new (n), hidden_new``, each ``[T, B, H]``
in bias_input's dtype; y and output_h hold every step's hidden state. The kernel never reads
seq_length, has_biases, num_layers, dropout, train, bidirectional or batch_first (the adapter
passes them along; the kernel is fixed UNIDIRECTIONAL, time major, training): accepted and ignored.

Per step (nn.GRU): r = sigmoid(x W_ir + b_ir + h W_hr + b_hr), z likewise, hn = h W_hn + b_hn,
n = tanh(x W_in + b_in + r * hn), h' = (1 - z) * n + z * h. LSTM: rnn.lstm's recurrence.

Computed in float32 (float64 stays float64 so gradcheck can run), results in the input dtype
(npu_gru: bias_input's). Autograd: gradients reach input, hx and params from y and the final
states (npu_gru: from y at every step and output_h at the last step, as npu_gru_backward reads
``gradh[T-1]``); the backward is explicit BPTT from the saved gates, shared with the registered
backward ops. Not emulated (NotImplementedError naming the argument): ``batch_sizes`` (packed
sequences: padded-step outputs not established), ``batch_first=True`` (the gate outputs' layout
is not established), dropout between layers in training (the mask's random stream is not
established), bfloat16 (op-plugin never calls aclnnLSTM/aclnnGRU with bfloat16).
"""
import torch
from torch.autograd.function import once_differentiable

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.rnn.lstm import _bptt as _lstm_bptt, _recurrence as _lstm_recurrence
from torch_npu.op_plugin.tensor import formats

__all__ = []

# float64 is accepted beyond the documented float16/float32 so gradcheck can run.
_DTYPES = (torch.float16, torch.float32, torch.float64)


def _compute_dtype(*tensors):
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_float(op, name, t):
    check(t.dtype in _DTYPES, op, "%s must be float16 or float32, got %s", (name, t.dtype))


# ----------------------------------------------------------------- GRU recurrence

def _gru_recurrence(x, w_i, w_h, b_i, b_h, h0, reverse):
    """x [T, B, I], w_i [I, 3H], w_h [H, 3H], b_i/b_h [3H] or None, h0 [B, H] (compute dtype).
    Returns (h, r, z, n, hn), each [T, B, H], indexed by time step."""
    steps = x.shape[0]
    xw = x @ w_i
    if b_i is not None:
        xw = xw + b_i
    h = h0
    per_step = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        hw = h @ w_h
        if b_h is not None:
            hw = hw + b_h
        x_r, x_z, x_n = xw[t].chunk(3, dim=-1)
        h_r, h_z, hn = hw.chunk(3, dim=-1)
        r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * hn)
        h = (1 - z) * n + z * h
        per_step[t] = (h, r, z, n, hn)
    return tuple(torch.stack(parts) for parts in zip(*per_step))


def _gru_bptt(dy, dh_last, x, w_i, w_h, h0, hs, r, z, n, hn):
    """Backward of the forward-direction recurrence from its saved gates (compute dtype).
    dy [T, B, H] on every h_t, dh_last [B, H] on h_{T-1}.
    Returns (dx [T, B, I], dw_i [I, 3H], dw_h [H, 3H], db_i [3H], db_h [3H], dh0 [B, H])."""
    steps = x.shape[0]
    dh_next = dh_last
    d_xw, d_hw = [None] * steps, [None] * steps
    for t in range(steps - 1, -1, -1):
        dh = dy[t] + dh_next
        h_prev = hs[t - 1] if t > 0 else h0
        dn_pre = dh * (1 - z[t]) * (1 - n[t] * n[t])
        dz_pre = dh * (h_prev - n[t]) * z[t] * (1 - z[t])
        dr_pre = dn_pre * hn[t] * r[t] * (1 - r[t])
        d_xw[t] = torch.cat([dr_pre, dz_pre, dn_pre], dim=-1)
        d_hw[t] = torch.cat([dr_pre, dz_pre, dn_pre * r[t]], dim=-1)
        dh_next = dh * z[t] + d_hw[t] @ w_h.t()
    d_xw, d_hw = torch.stack(d_xw), torch.stack(d_hw)  # [T, B, 3H]
    h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]])
    return (d_xw @ w_i.t(), torch.einsum("tbk,tbg->kg", x, d_xw), torch.einsum("tbk,tbg->kg", h_prev, d_hw),
            d_xw.sum(dim=(0, 1)), d_hw.sum(dim=(0, 1)), dh_next)


def _flip_time(*tensors):
    return tuple(t.flip(0) for t in tensors)


# ----------------------------------------------------------------- argument checks (multi-layer)

def _check_stack(op, gates, input, hiddens, params, has_biases, num_layers, dropout, train, bidirectional,
                 batch_first, batch_sizes):
    """Validates the nn.LSTM / nn.GRU style arguments; returns (T, B, H, D)."""
    # The real adapters treat an empty batch_sizes (autograd's stand-in for None) as None.
    if batch_sizes is not None and batch_sizes.numel() > 0:
        unsupported(op, "batch_sizes (packed sequences)")
    if batch_first:
        unsupported(op, "batch_first=True (the gate outputs' layout)")
    check(num_layers >= 1, op, "num_layers must be >= 1, got %d", num_layers)
    if train and dropout > 0 and num_layers > 1:
        unsupported(op, "dropout > 0 between layers in training")
    check(input.dim() == 3, op, "input must be 3-D [T, B, I], got %d-D", input.dim())
    steps, batch, in_size = input.shape
    check(steps > 0, op, "input must have at least one time step")
    directions = 2 if bidirectional else 1
    per_cell = 4 if has_biases else 2
    check(len(params) == per_cell * num_layers * directions, op,
          "params must hold %d tensors (%d per layer and direction), got %d",
          (per_cell * num_layers * directions, per_cell, len(params)))
    check(params[1].dim() == 2 and params[1].shape[0] == gates * params[1].shape[1] and params[1].shape[1] > 0, op,
          "w_hh must be [%d*hidden_size, hidden_size], got %s", (gates, tuple(params[1].shape)))
    hidden = params[1].shape[1]
    for layer in range(num_layers):
        layer_in = in_size if layer == 0 else directions * hidden
        for d in range(directions):
            base = (layer * directions + d) * per_cell
            expected = [(gates * hidden, layer_in), (gates * hidden, hidden)]
            expected += [(gates * hidden,)] * (per_cell - 2)
            for k, shape in enumerate(expected):
                p = params[base + k]
                check(tuple(p.shape) == shape, op, "params[%d] must be %s, got %s", (base + k, shape, tuple(p.shape)))
                _check_float(op, "params[%d]" % (base + k), p)
    _check_float(op, "input", input)
    for name, t in hiddens:
        _check_float(op, name, t)
        check(tuple(t.shape) == (num_layers * directions, batch, hidden), op, "%s must be [L*D, B, H] = %s, got %s",
              (name, (num_layers * directions, batch, hidden), tuple(t.shape)))
    return steps, batch, hidden, directions


def _cell_params(params, has_biases, index, dtype):
    """(w_ih^T [I_l, G*H], w_hh^T [H, G*H], b_ih, b_hh) of cell l*D + d, in the compute dtype."""
    per_cell = 4 if has_biases else 2
    cell = [p.to(dtype) for p in params[index * per_cell:(index + 1) * per_cell]]
    return cell[0].t(), cell[1].t(), (cell[2] if has_biases else None), (cell[3] if has_biases else None)


def _layer_input(x, hs, layer, directions):
    return x if layer == 0 else torch.cat([hs[(layer - 1) * directions + d] for d in range(directions)], dim=-1)


def _final(steps_out, reverse):
    return steps_out[0] if reverse else steps_out[-1]


def _or_zeros(grad, like):
    return torch.zeros_like(like) if grad is None else grad.to(like.dtype)


def _param_grads(params, has_biases, per_cell_grads):
    """Flat gradient list in params' order and dtypes from per-cell (dw_ih^T, dw_hh^T, db_ih, db_hh)."""
    grads = []
    for dw_i, dw_h, db_i, db_h in per_cell_grads:
        grads += [dw_i.t(), dw_h.t()] + ([db_i, db_h] if has_biases else [])
    return [g.to(p.dtype) for g, p in zip(grads, params)]


# ----------------------------------------------------------------- _lstm_npu

def _lstm_stack(x, h0, c0, params, has_biases, num_layers, directions):
    """Forward of the layer stack in the compute dtype. Returns (y, hy, cy, [per-cell outs])
    where each per-cell out is rnn.lstm's (h, c, i, j, f, o, tanhc)."""
    cells, layer_in = [], x
    for layer in range(num_layers):
        for d in range(directions):
            idx = layer * directions + d
            w_i, w_h, b_i, b_h = _cell_params(params, has_biases, idx, x.dtype)
            bias = None if b_i is None else b_i + b_h
            cells.append(_lstm_recurrence(layer_in, torch.cat([w_i, w_h]), bias, h0[idx], c0[idx], d == 1))
        layer_in = torch.cat([cells[layer * directions + d][0] for d in range(directions)], dim=-1)
    hy = torch.stack([_final(cell[0], idx % directions == 1) for idx, cell in enumerate(cells)])
    cy = torch.stack([_final(cell[1], idx % directions == 1) for idx, cell in enumerate(cells)])
    return layer_in, hy, cy, cells


def _lstm_stack_backward(dy, dhy, dcy, x, h0, c0, params, has_biases, num_layers, directions, gates):
    """BPTT through the stack (compute dtype). gates = (i, j, f, o, h, c, tanhc), each [L*D, T, B, H].
    Returns (dx, dh0, dc0, [per-cell (dw_ih^T, dw_hh^T, db, db)])."""
    gi, gj, gf, go, hs, cs, tanhc = gates
    hidden = hs.shape[-1]
    cell_grads = [None] * (num_layers * directions)
    dh0, dc0 = [None] * len(cell_grads), [None] * len(cell_grads)
    d_out = dy
    for layer in range(num_layers - 1, -1, -1):
        layer_in = _layer_input(x, hs, layer, directions)
        d_in = torch.zeros_like(layer_in)
        for d in range(directions):
            idx = layer * directions + d
            w_i, w_h, _, _ = _cell_params(params, has_biases, idx, x.dtype)
            seq = (layer_in, d_out[..., d * hidden:(d + 1) * hidden], hs[idx], cs[idx], gi[idx], gj[idx], gf[idx],
                   go[idx], tanhc[idx])
            if d == 1:  # the reverse direction is the forward recurrence over flipped time
                seq = _flip_time(*seq)
            xs, dys, h_seq, c_seq, i_, j_, f_, o_, tc = seq
            dx, dw, db, dh0[idx], dc0[idx] = _lstm_bptt(dys, dhy[idx], dcy[idx], xs, torch.cat([w_i, w_h]), h0[idx],
                                                         c0[idx], h_seq, c_seq, i_, j_, f_, o_, tc)
            d_in = d_in + (dx.flip(0) if d == 1 else dx)
            in_size = layer_in.shape[-1]
            cell_grads[idx] = (dw[:in_size], dw[in_size:], db, db)
        d_out = d_in
    return d_out, torch.stack(dh0), torch.stack(dc0), cell_grads


class _LstmStack(torch.autograd.Function):
    """_lstm_npu with the gradient routing of _lstm_npu_backward (from y, hy and cy)."""

    @staticmethod
    def forward(ctx, input, h0, c0, spec, *params):
        has_biases, num_layers, directions = spec
        dtype = _compute_dtype(input, h0, c0, *params)
        y, hy, cy, cells = _lstm_stack(input.to(dtype), h0.to(dtype), c0.to(dtype), params, has_biases, num_layers,
                                       directions)
        h, c, i, j, f, o, tanhc = (torch.stack(parts) for parts in zip(*cells))
        ctx.spec = spec
        ctx.save_for_backward(input, h0, c0, i, j, f, o, h, c, tanhc, *params)
        outs = tuple(t.to(input.dtype) for t in (y, hy, cy, i, j, f, o, h, c, tanhc))
        ctx.mark_non_differentiable(*outs[3:])
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dhy, dcy, *_gate_grads):
        input, h0, c0, i, j, f, o, h, c, tanhc = ctx.saved_tensors[:10]
        params = ctx.saved_tensors[10:]
        has_biases, num_layers, directions = ctx.spec
        dtype = h.dtype
        dx, dh0, dc0, cell_grads = _lstm_stack_backward(
            _or_zeros(dy, torch.empty(input.shape[:2] + (directions * h.shape[-1],), dtype=dtype, device=h.device)),
            _or_zeros(dhy, h0.to(dtype)), _or_zeros(dcy, c0.to(dtype)), input.to(dtype), h0.to(dtype), c0.to(dtype),
            params, has_biases, num_layers, directions, (i, j, f, o, h, c, tanhc))
        return (dx.to(input.dtype), dh0.to(h0.dtype), dc0.to(c0.dtype), None) + tuple(
            _param_grads(params, has_biases, cell_grads))


def _check_lstm(op, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                batch_sizes):
    check(len(hx) == 2, op, "hx must be [h0, c0], got %d tensors", len(hx))
    check(input.dtype != torch.bfloat16, op, "bfloat16 is not supported")
    return _check_stack(op, 4, input, (("hx[0]", hx[0]), ("hx[1]", hx[1])), params, has_biases, num_layers, dropout,
                        train, bidirectional, batch_first, batch_sizes)


@impl("_lstm_npu")
def _lstm_npu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, *, batch_first=False,
              batch_sizes=None):
    """Multi-layer LSTM; returns (y, hy, cy, i, j, f, o, h, c, tanhc) (see the module doc)."""
    _, _, _, directions = _check_lstm("_lstm_npu", input, hx, params, has_biases, num_layers, dropout, train,
                                      bidirectional, batch_first, batch_sizes)
    outs = _LstmStack.apply(input, hx[0], hx[1], (bool(has_biases), num_layers, directions), *params)
    if train:
        return outs
    return outs[:3] + (None, None, None, None) + outs[7:9] + (None,)  # no gate lists in inference


@impl("_lstm_npu_backward")
def _lstm_npu_backward(grad_y, grad_hy, grad_cy, input, hx, params, i, j, f, o, h, c, tanhc, has_biases, num_layers,
                       dropout, train, bidirectional, *, batch_first=False, batch_sizes=None):
    """Gradients (input, [h0, c0], params) of _lstm_npu from its saved per-step outputs."""
    op = "_lstm_npu_backward"
    steps, batch, hidden, directions = _check_lstm(op, input, hx, params, has_biases, num_layers, dropout, train,
                                                   bidirectional, batch_first, batch_sizes)
    gate_shape = (num_layers * directions, steps, batch, hidden)
    gates = (i, j, f, o, h, c, tanhc)
    for name, t in zip(("i", "j", "f", "o", "h", "c", "tanhc"), gates):
        check(t is not None and tuple(t.shape) == gate_shape, op,
              "%s must be [L*D, T, B, H] = %s, got %s", (name, gate_shape, None if t is None else tuple(t.shape)))
    dtype = _compute_dtype(input, *hx, *params)
    h0, c0 = hx[0].to(dtype), hx[1].to(dtype)
    dy_like = torch.zeros((steps, batch, directions * hidden), dtype=dtype, device=input.device)
    dx, dh0, dc0, cell_grads = _lstm_stack_backward(
        _or_zeros(grad_y, dy_like), _or_zeros(grad_hy, h0), _or_zeros(grad_cy, c0), input.to(dtype), h0, c0, params,
        bool(has_biases), num_layers, directions, tuple(t.to(dtype) for t in gates))
    return dx.to(input.dtype), [dh0.to(hx[0].dtype), dc0.to(hx[1].dtype)], _param_grads(params, has_biases,
                                                                                         cell_grads)


# ----------------------------------------------------------------- _gru_npu

def _gru_stack(x, h0, params, has_biases, num_layers, directions):
    """Forward of the GRU layer stack (compute dtype): (y, hy, [per-cell (h, r, z, n, hn)])."""
    cells, layer_in = [], x
    for layer in range(num_layers):
        for d in range(directions):
            idx = layer * directions + d
            w_i, w_h, b_i, b_h = _cell_params(params, has_biases, idx, x.dtype)
            cells.append(_gru_recurrence(layer_in, w_i, w_h, b_i, b_h, h0[idx], d == 1))
        layer_in = torch.cat([cells[layer * directions + d][0] for d in range(directions)], dim=-1)
    hy = torch.stack([_final(cell[0], idx % directions == 1) for idx, cell in enumerate(cells)])
    return layer_in, hy, cells


def _gru_stack_backward(dy, dhy, x, h0, params, has_biases, num_layers, directions, gates):
    """BPTT through the GRU stack. gates = (r, z, n, hn, h), each [L*D, T, B, H]."""
    r, z, n, hn, hs = gates
    hidden = hs.shape[-1]
    cell_grads, dh0 = [None] * (num_layers * directions), [None] * (num_layers * directions)
    d_out = dy
    for layer in range(num_layers - 1, -1, -1):
        layer_in = _layer_input(x, hs, layer, directions)
        d_in = torch.zeros_like(layer_in)
        for d in range(directions):
            idx = layer * directions + d
            w_i, w_h, _, _ = _cell_params(params, has_biases, idx, x.dtype)
            seq = (layer_in, d_out[..., d * hidden:(d + 1) * hidden], hs[idx], r[idx], z[idx], n[idx], hn[idx])
            if d == 1:
                seq = _flip_time(*seq)
            xs, dys, h_seq, r_, z_, n_, hn_ = seq
            dx, dw_i, dw_h, db_i, db_h, dh0[idx] = _gru_bptt(dys, dhy[idx], xs, w_i, w_h, h0[idx], h_seq, r_, z_, n_,
                                                              hn_)
            d_in = d_in + (dx.flip(0) if d == 1 else dx)
            cell_grads[idx] = (dw_i, dw_h, db_i, db_h)
        d_out = d_in
    return d_out, torch.stack(dh0), cell_grads


class _GruStack(torch.autograd.Function):
    """_gru_npu with the gradient routing of _gru_npu_backward (from y and hy)."""

    @staticmethod
    def forward(ctx, input, h0, spec, *params):
        has_biases, num_layers, directions = spec
        dtype = _compute_dtype(input, h0, *params)
        y, hy, cells = _gru_stack(input.to(dtype), h0.to(dtype), params, has_biases, num_layers, directions)
        h, r, z, n, hn = (torch.stack(parts) for parts in zip(*cells))
        ctx.spec = spec
        ctx.save_for_backward(input, h0, r, z, n, hn, h, *params)
        outs = tuple(t.to(input.dtype) for t in (y, hy, r, z, n, hn, h))
        ctx.mark_non_differentiable(*outs[2:])
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dhy, *_gate_grads):
        input, h0, r, z, n, hn, h = ctx.saved_tensors[:7]
        params = ctx.saved_tensors[7:]
        has_biases, num_layers, directions = ctx.spec
        dtype = h.dtype
        dy_like = torch.zeros(input.shape[:2] + (directions * h.shape[-1],), dtype=dtype, device=h.device)
        dx, dh0, cell_grads = _gru_stack_backward(_or_zeros(dy, dy_like), _or_zeros(dhy, h0.to(dtype)),
                                                  input.to(dtype), h0.to(dtype), params, has_biases, num_layers,
                                                  directions, (r, z, n, hn, h))
        return (dx.to(input.dtype), dh0.to(h0.dtype), None) + tuple(_param_grads(params, has_biases, cell_grads))


def _check_gru(op, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
               batch_sizes):
    check(input.dtype != torch.bfloat16, op, "bfloat16 is not supported")
    return _check_stack(op, 3, input, (("hx", hx),), params, has_biases, num_layers, dropout, train, bidirectional,
                        batch_first, batch_sizes)


@impl("_gru_npu")
def _gru_npu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, *, batch_first=False,
             batch_sizes=None):
    """Multi-layer GRU; returns (y, hy, r, z, n, h_n, h) (see the module doc)."""
    _, _, _, directions = _check_gru("_gru_npu", input, hx, params, has_biases, num_layers, dropout, train,
                                     bidirectional, batch_first, batch_sizes)
    outs = _GruStack.apply(input, hx, (bool(has_biases), num_layers, directions), *params)
    return outs if train else outs[:2] + (None,) * 5  # no gate lists in inference


@impl("_gru_npu_backward")
def _gru_npu_backward(grad_y, grad_h, input, hx, params, r, z, n, h_n, h, has_biases, num_layers, dropout, train,
                      bidirectional, *, batch_first=False, batch_sizes=None):
    """Gradients (input, hx, params) of _gru_npu from its saved per-step outputs."""
    op = "_gru_npu_backward"
    steps, batch, hidden, directions = _check_gru(op, input, hx, params, has_biases, num_layers, dropout, train,
                                                  bidirectional, batch_first, batch_sizes)
    gate_shape = (num_layers * directions, steps, batch, hidden)
    gates = (r, z, n, h_n, h)
    for name, t in zip(("r", "z", "n", "h_n", "h"), gates):
        check(t is not None and tuple(t.shape) == gate_shape, op,
              "%s must be [L*D, T, B, H] = %s, got %s", (name, gate_shape, None if t is None else tuple(t.shape)))
    dtype = _compute_dtype(input, hx, *params)
    h0 = hx.to(dtype)
    dy_like = torch.zeros((steps, batch, directions * hidden), dtype=dtype, device=input.device)
    dx, dh0, cell_grads = _gru_stack_backward(_or_zeros(grad_y, dy_like), _or_zeros(grad_h, h0), input.to(dtype), h0,
                                              params, bool(has_biases), num_layers, directions,
                                              tuple(t.to(dtype) for t in gates))
    return dx.to(input.dtype), dh0.to(hx.dtype), _param_grads(params, has_biases, cell_grads)


# ----------------------------------------------------------------- npu_gru (DynamicGRUV2)

def _check_npu_gru(op, input, hx, weight_input, weight_hidden, bias_input, bias_hidden):
    """Validates the documented layout; returns (T, B, I, H)."""
    check(input.dim() == 3, op, "input must be 3-D [T, B, I], got %d-D", input.dim())
    steps, batch, in_size = input.shape
    check(steps > 0, op, "input must have at least one time step")
    check(bias_input.dim() == 1 and bias_input.shape[0] % 3 == 0 and bias_input.shape[0] > 0, op,
          "bias_input must be 1-D [3*hidden_size], got %s", (tuple(bias_input.shape),))
    hidden = bias_input.shape[0] // 3
    for name, t, shape in (("weight_input", weight_input, (in_size, 3 * hidden)),
                           ("weight_hidden", weight_hidden, (hidden, 3 * hidden)),
                           ("bias_hidden", bias_hidden, (3 * hidden,))):
        check(tuple(t.shape) == shape, op, "%s must be %s, got %s", (name, shape, tuple(t.shape)))
    check(tuple(hx.shape) in ((batch, hidden), (1, batch, hidden)), op,
          "hx must be [B, H] or [1, B, H] with B=%d, H=%d, got %s", (batch, hidden, tuple(hx.shape)))
    for name, t in (("input", input), ("hx", hx), ("weight_input", weight_input), ("weight_hidden", weight_hidden),
                    ("bias_input", bias_input), ("bias_hidden", bias_hidden)):
        _check_float(op, name, t)
    return steps, batch, in_size, hidden


class _NpuGru(torch.autograd.Function):
    """npu_gru with npu_gru_backward's routing: y at every step, output_h at the last step only."""

    @staticmethod
    def forward(ctx, input, hx, weight_input, weight_hidden, bias_input, bias_hidden):
        dtype = _compute_dtype(input, hx, weight_input, weight_hidden, bias_input, bias_hidden)
        h, r, z, n, hn = _gru_recurrence(input.to(dtype), weight_input.to(dtype), weight_hidden.to(dtype),
                                         bias_input.to(dtype), bias_hidden.to(dtype), _h2d(hx).to(dtype), False)
        ctx.save_for_backward(input, hx, weight_input, weight_hidden, bias_input, bias_hidden, h, r, z, n, hn)
        out_dtype = bias_input.dtype  # the adapter allocates every output with bias_input's options
        outs = (h.to(out_dtype), h.to(out_dtype).clone(), z.to(out_dtype), r.to(out_dtype), n.to(out_dtype),
                hn.to(out_dtype))
        ctx.mark_non_differentiable(*outs[2:])
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh, *_gate_grads):
        input, hx, w_i, w_h, b_i, b_h, h, r, z, n, hn = ctx.saved_tensors
        grads = _npu_gru_grads(dy, dh, input, hx, w_i, w_h, h, r, z, n, hn)
        d_wi, d_wh, d_x, d_bi, d_bh, d_hx = grads
        return (d_x, d_hx.to(hx.dtype), d_wi.to(w_i.dtype), d_wh.to(w_h.dtype), d_bi.to(b_i.dtype),
                d_bh.to(b_h.dtype))


def _h2d(hx):
    return hx.reshape(hx.shape[-2:])  # [1, B, H] and [B, H] hold the same state


def _npu_gru_grads(grady, gradh, input, hx, w_i, w_h, h, r, z, n, hn):
    """(dw_input, dw_hidden, dx, db_input, db_hidden, dh_prev) in input's dtype (the adapter
    allocates every gradient with input's options); dh_prev has hx's shape."""
    dtype = _compute_dtype(input, hx, w_i, w_h, h)
    hs = h.to(dtype)
    dy = torch.zeros_like(hs) if grady is None else grady.to(dtype)
    dh_last = torch.zeros_like(hs[-1]) if gradh is None else gradh[input.shape[0] - 1].to(dtype)
    dx, dw_i, dw_h, db_i, db_h, dh0 = _gru_bptt(dy, dh_last, input.to(dtype), w_i.to(dtype), w_h.to(dtype),
                                                _h2d(hx).to(dtype), hs, r.to(dtype), z.to(dtype),
                                                n.to(dtype), hn.to(dtype))
    out = input.dtype
    return (dw_i.to(out), dw_h.to(out), dx.to(out), db_i.to(out), db_h.to(out), dh0.reshape(hx.shape).to(out))


def _outputs_in_nz(outs, op):
    """The adapter allocates y, update, reset, new and hidden_new in FRACTAL_NZ, output_h in ND;
    formats are a storage tag here (no tag when internal formats are disallowed)."""
    if torch.npu.config.allow_internal_format:
        for index in (0, 2, 3, 4, 5):
            formats._tag(outs[index], formats.Format.FRACTAL_NZ, op)
    return outs


@impl("npu_gru")
def npu_gru(input, hx, weight_input, weight_hidden, bias_input, bias_hidden, seq_length, has_biases, num_layers,
            dropout, train, bidirectional, batch_first):
    """One GRU layer (DynamicGRUV2); returns (y, output_h, update, reset, new, hidden_new), each [T, B, H]."""
    op = "npu_gru"
    _check_npu_gru(op, input, hx, weight_input, weight_hidden, bias_input, bias_hidden)
    return _outputs_in_nz(_NpuGru.apply(input, hx, weight_input, weight_hidden, bias_input, bias_hidden), op)


@impl("npu_gru_backward")
def npu_gru_backward(grady, gradh, input, weight_input, weight_hidden, bias_input, bias_hidden, seq_length, hx,
                     y_output, h_output, output_updata, output_reset, output_new, hidden_new):
    """(dw_input, dw_hidden, dx, db_input, db_hidden, dh_prev) of npu_gru from its saved outputs;
    ``gradh`` contributes at the last step only."""
    op = "npu_gru_backward"
    steps, batch, _, hidden = _check_npu_gru(op, input, hx, weight_input, weight_hidden, bias_input, bias_hidden)
    for name, t in (("h_output", h_output), ("output_updata", output_updata), ("output_reset", output_reset),
                    ("output_new", output_new), ("hidden_new", hidden_new)):
        check(tuple(t.shape) == (steps, batch, hidden), op,
              "%s must be [T, B, H] = %s, got %s", (name, (steps, batch, hidden), tuple(t.shape)))
    return _npu_gru_grads(grady, gradh, input, hx, weight_input, weight_hidden, h_output, output_reset,
                          output_updata, output_new, hidden_new)
