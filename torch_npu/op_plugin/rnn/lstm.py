"""npu_lstm, npu_lstm_data, npu_lstm_cell and their backwards: the DynamicRNN LSTM.

Layout, as op-plugin builds the call (``LstmKernelNpu.cpp``, ``LstmCellKernelNpu.cpp``):

* ``npu_lstm`` / ``npu_lstm_data``: input ``x [T, B, I]`` (time major), ``weight [I+H, 4H]``
  = ``cat([w_ih, w_hh], 1).t()`` of nn.LSTM, ``bias [4H]`` = ``b_ih + b_hh`` (zeros without
  biases), ``h, c [1, B, H]``; H = ``bias.size(0) / 4``. The 4H columns are the gates in
  ``gate_order="ifjo"`` (input, forget, cell candidate j, output), nn.LSTM's own order.
* ``npu_lstm_cell``: one step; ``input [B, I]``, ``w_ih [I, 4H]``, ``w_hh [H, 4H]`` (the
  transposed nn.LSTMCell weights), ``h, c [B, H]``, optional ``b_ih, b_hh [4H]`` (summed).

Per step t:  z = x_t @ W_x + h_{t-1} @ W_h + b;  i, f, o = sigmoid(z_i, z_f, z_o);  j = tanh(z_j);
c_t = f * c_{t-1} + i * j;  tanhc_t = tanh(c_t);  h_t = o * tanhc_t.  The 8 outputs are
``y, h, c, i, j, f, o, tanhc``, each ``[T, B, H]`` (y and h hold the same values; the cell
returns h and c of its single step as ``[B, H]``).

``direction=True`` ("REDIRECTIONAL") runs the recurrence from t = T-1 down to 0 and stores
every output at its own time index (the final state is at index 0), as op-plugin's packed
bidirectional path reads it. The kernel's math does not use ``has_biases``, ``num_layers``,
``dropout``, ``bidirectional``, ``batch_first`` or ``batch_sizes`` (the docs list them as not
supported; callers pass them along, e.g. bidirectional=True for each direction), so they are
accepted and ignored here too; ``train`` only picks the gate outputs' format (FRACTAL_NZ tag
when True, ND when False; the cell's gates are always NZ). ``flag_seq=True`` (packed sequences through
``seq_mask``) is documented as not supported and its padded-step outputs are not established:
it raises NotImplementedError.

Autograd follows the real registration: gradients reach input, weight, bias, h and c from y
(every step) and from h and c at the last step only (``npu_lstm_backward`` reads ``gradh[T-1]``
and ``gradc[T-1]``); gradients on the gate outputs are ignored. The backward is the explicit
BPTT from the saved gates, shared with the registered ``*_backward`` ops. Computed in float32
(float64 stays float64, for gradcheck), returned in the input dtype.
"""
import torch
from torch.autograd.function import once_differentiable

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.tensor import formats

__all__ = []

# float64 is accepted beyond the documented float16/float32 so gradcheck can run.
_DTYPES = (torch.float16, torch.float32, torch.float64)


def _recurrence(x, weight, bias, h0, c0, reverse):
    """x [T, B, I], weight [I+H, 4H], bias [4H] or None, h0/c0 [B, H], all in the compute dtype.
    Returns (h, c, i, j, f, o, tanhc), each [T, B, H], indexed by time step."""
    steps = x.shape[0]
    w_x, w_h = weight[:x.shape[2]], weight[x.shape[2]:]
    xw = x @ w_x  # the input projection of every step at once
    if bias is not None:
        xw = xw + bias
    h, c = h0, c0
    per_step = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        z_i, z_f, z_j, z_o = (xw[t] + h @ w_h).chunk(4, dim=-1)
        i, f, j, o = torch.sigmoid(z_i), torch.sigmoid(z_f), torch.tanh(z_j), torch.sigmoid(z_o)
        c = f * c + i * j
        tanhc = torch.tanh(c)
        h = o * tanhc
        per_step[t] = (h, c, i, j, f, o, tanhc)
    return tuple(torch.stack(parts) for parts in zip(*per_step))


def _bptt(dy, dh_last, dc_last, x, weight, h0, c0, hs, cs, gi, gj, gf, go, tanhc):
    """Backward of the forward (unidirectional) recurrence from its saved gates, compute dtype.
    dy [T, B, H] on every h_t, dh_last/dc_last [B, H] on h_{T-1}/c_{T-1}.
    Returns (dx [T, B, I], dweight [I+H, 4H], dbias [4H], dh0 [B, H], dc0 [B, H])."""
    steps, in_size = x.shape[0], x.shape[2]
    w_x, w_h = weight[:in_size], weight[in_size:]
    dh_next, dc_next = dh_last, dc_last
    dz = [None] * steps
    for t in range(steps - 1, -1, -1):
        dh = dy[t] + dh_next
        dc = dc_next + dh * go[t] * (1 - tanhc[t] * tanhc[t])
        c_prev = cs[t - 1] if t > 0 else c0
        dz[t] = torch.cat([dc * gj[t] * gi[t] * (1 - gi[t]),
                           dc * c_prev * gf[t] * (1 - gf[t]),
                           dc * gi[t] * (1 - gj[t] * gj[t]),
                           dh * tanhc[t] * go[t] * (1 - go[t])], dim=-1)
        dh_next = dz[t] @ w_h.t()
        dc_next = dc * gf[t]
    dz = torch.stack(dz)  # [T, B, 4H]
    dx = dz @ w_x.t()
    h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]])
    dweight = torch.einsum("tbk,tbg->kg", torch.cat([x, h_prev], dim=-1), dz)
    return dx, dweight, dz.sum(dim=(0, 1)), dh_next, dc_next


def _grad_or_zeros(grad, like):
    return torch.zeros_like(like) if grad is None else acc(grad)


class _Lstm(torch.autograd.Function):
    """Sequence LSTM with the real op's gradient routing (see the module doc)."""

    @staticmethod
    def forward(ctx, x, weight, bias, h0, c0, reverse, op):
        dtype = x.dtype
        outs = _recurrence(acc(x), acc(weight), acc(bias), acc(h0), acc(c0), reverse)
        hs, cs = outs[0], outs[1]
        ctx.reverse, ctx.op = reverse, op
        ctx.save_for_backward(x, weight, h0, c0, *outs)
        y = hs.to(dtype)
        return (y, hs.to(dtype).clone(), cs.to(dtype)) + tuple(g.to(dtype) for g in outs[2:])

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh, dc, *_gate_grads):
        if ctx.reverse:
            unsupported(ctx.op, "the backward of direction=True")
        x, weight, h0, c0, hs, cs, gi, gj, gf, go, tanhc = ctx.saved_tensors
        dx, dw, db, dh0, dc0 = _bptt(_grad_or_zeros(dy, hs), _grad_or_zeros(None if dh is None else dh[-1], hs[-1]),
                                     _grad_or_zeros(None if dc is None else dc[-1], cs[-1]),
                                     acc(x), acc(weight), acc(h0), acc(c0), hs, cs, gi, gj, gf, go, tanhc)
        return (dx.to(x.dtype), dw.to(weight.dtype), db.to(weight.dtype), dh0.to(h0.dtype).unsqueeze(0),
                dc0.to(c0.dtype).unsqueeze(0), None, None)


def _gates_in_nz(outs, op):
    """The real adapter allocates i, j, f, o, tanhc in FRACTAL_NZ (training / the cell); formats are
    a storage tag here. With internal formats disallowed they stay ND, silently, as there."""
    if torch.npu.config.allow_internal_format:
        for gate in outs[3:]:
            formats._tag(gate, formats.Format.FRACTAL_NZ, op)
    return outs


def _check_float(op, name, t, dtype):
    check(t.dtype in _DTYPES, op, "%s must be float16 or float32, got %s", (name, t.dtype))
    check(t.dtype == dtype, op, "%s dtype %s must match input dtype %s", (name, t.dtype, dtype))


def _check_sequence(op, input, weight, bias, h, c):
    """Validates the documented shapes; returns (T, B, I, H)."""
    check(input.dim() == 3, op, "input must be 3-D [T, B, I], got %d-D", input.dim())
    steps, batch, in_size = input.shape
    check(steps > 0, op, "input must have at least one time step")
    check(bias.dim() == 1 and bias.shape[0] % 4 == 0 and bias.shape[0] > 0, op,
          "bias must be 1-D [4*hidden_size], got %s", (tuple(bias.shape),))
    hidden = bias.shape[0] // 4
    check(tuple(weight.shape) == (in_size + hidden, 4 * hidden), op,
          "weight must be [input_size + hidden_size, 4*hidden_size] = %s, got %s",
          ((in_size + hidden, 4 * hidden), tuple(weight.shape)))
    for name, t in (("h", h), ("c", c)):
        check(tuple(t.shape) == (1, batch, hidden), op,
              "%s must be [1, B, hidden_size] = %s, got %s", (name, (1, batch, hidden), tuple(t.shape)))
    for name, t in (("input", input), ("weight", weight), ("bias", bias), ("h", h), ("c", c)):
        _check_float(op, name, t, input.dtype)
    return steps, batch, in_size, hidden


def _lstm_sequence(op, input, weight, bias, h, c, train, flag_seq, direction):
    _check_sequence(op, input, weight, bias, h, c)
    if flag_seq:
        unsupported(op, "flag_seq=True (packed sequences through seq_mask)")
    outs = _Lstm.apply(input, weight, bias, h[0], c[0], bool(direction), op)
    return _gates_in_nz(outs, op) if train else outs


@impl("npu_lstm")
def npu_lstm(input, weight, bias, seq_mask, h, c, has_biases, num_layers, dropout, train, bidirectional,
             batch_first, flag_seq, direction):
    """One LSTM layer over ``input`` [T, B, I]; returns (y, h, c, i, j, f, o, tanhc), each [T, B, H]."""
    return _lstm_sequence("npu_lstm", input, weight, bias, h, c, train, flag_seq, direction)


@impl("npu_lstm_data")
def npu_lstm_data(input, batch_sizes, weight, bias, seq_mask, h, c, has_biases, num_layers, dropout, train,
                  bidirectional, batch_first, flag_seq, direction):
    """npu_lstm's kernel with PackedSequence ``batch_sizes`` alongside (not read by the kernel)."""
    return _lstm_sequence("npu_lstm_data", input, weight, bias, h, c, train, flag_seq, direction)


def _sequence_backward(op, grady, gradh, gradc, input, weight, bias, hx, cx, y, h, c, i, j, f, o, tanhc):
    steps = input.shape[0]
    _check_sequence(op, input, weight, bias, hx, cx)
    hs, cs = acc(h), acc(c)
    dy = _grad_or_zeros(grady, hs)
    dh_last = _grad_or_zeros(None if gradh is None else gradh[steps - 1], hs[-1])
    dc_last = _grad_or_zeros(None if gradc is None else gradc[steps - 1], cs[-1])
    dx, dw, db, dh0, dc0 = _bptt(dy, dh_last, dc_last, acc(input), acc(weight), acc(hx[0]), acc(cx[0]), hs, cs,
                                 acc(i), acc(j), acc(f), acc(o), acc(tanhc))
    return (dx.to(input.dtype), dw.to(weight.dtype), db.to(bias.dtype), dh0.unsqueeze(0).to(hx.dtype),
            dc0.unsqueeze(0).to(cx.dtype))


@impl("npu_lstm_backward")
def npu_lstm_backward(grady, gradh, gradc, input, weight, bias, hx, cx, y_output, h_output, c_output, i, j, f, o,
                      tanhc):
    """Gradients (input, weight, bias, h0 [1, B, H], c0 [1, B, H]) of npu_lstm from the saved outputs;
    ``gradh``/``gradc`` contribute at the last step only."""
    return _sequence_backward("npu_lstm_backward", grady, gradh, gradc, input, weight, bias, hx, cx, y_output,
                              h_output, c_output, i, j, f, o, tanhc)


@impl("npu_lstm_data_backward")
def npu_lstm_data_backward(grady_opt, gradh_opt, gradc_opt, input, batch_sizes, weight, bias, init_h, init_c, y, h,
                           c, i, j, f, o, tanhc, flag_direction):
    """npu_lstm_backward for npu_lstm_data. The real kernel masks padded steps from ``batch_sizes``;
    only full batches (every entry == B, so no step is masked) are emulated, which needs a host read."""
    op = "npu_lstm_data_backward"
    if flag_direction:
        unsupported(op, "flag_direction=True")
    check(batch_sizes.dim() == 1 and batch_sizes.shape[0] == input.shape[0], op,
          "batch_sizes must be 1-D [T=%d], got %s", (input.shape[0], tuple(batch_sizes.shape)))
    if batch_sizes.device.type != "meta" and not isinstance(batch_sizes, torch._subclasses.FakeTensor):
        if bool((batch_sizes != input.shape[1]).any()):
            unsupported(op, "batch_sizes with padded steps (an entry below B)")
    return _sequence_backward(op, grady_opt, gradh_opt, gradc_opt, input, weight, bias, init_h, init_c, y, h, c, i,
                              j, f, o, tanhc)


class _LstmCell(torch.autograd.Function):
    """One LSTM step; gradients from y [1, B, H], h [B, H] and c [B, H], as npu_lstm_cell_backward."""

    @staticmethod
    def forward(ctx, x, w_ih, w_hh, h, c, bias):
        dtype = x.dtype
        weight = torch.cat([acc(w_ih), acc(w_hh)])
        outs = _recurrence(acc(x).unsqueeze(0), weight, None if bias is None else acc(bias), acc(h), acc(c), False)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, w_ih, w_hh, h, c, *outs)
        hs, cs = outs[0], outs[1]
        return (hs.to(dtype), hs[0].to(dtype), cs[0].to(dtype)) + tuple(g.to(dtype) for g in outs[2:])

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh, dc, *_gate_grads):
        x, w_ih, w_hh, h, c, hs, cs, gi, gj, gf, go, tanhc = ctx.saved_tensors
        grads = _cell_grads(dy, dh, dc, x, w_ih, w_hh, h, c, hs, cs, gi, gj, gf, go, tanhc)
        d_x, d_wih, d_whh, d_bias, d_h, d_c = grads
        return d_x, d_wih, d_whh, d_h, d_c, (d_bias if ctx.has_bias else None)


def _cell_grads(dy, dh, dc, x, w_ih, w_hh, h, c, hs, cs, gi, gj, gf, go, tanhc):
    weight = torch.cat([acc(w_ih), acc(w_hh)])
    dx, dw, db, dh0, dc0 = _bptt(_grad_or_zeros(dy, acc(hs)), _grad_or_zeros(dh, acc(h)), _grad_or_zeros(dc, acc(c)),
                                 acc(x).unsqueeze(0), weight, acc(h), acc(c), acc(hs), acc(cs), acc(gi), acc(gj),
                                 acc(gf), acc(go), acc(tanhc))
    in_size = x.shape[1]
    return (dx[0].to(x.dtype), dw[:in_size].to(w_ih.dtype), dw[in_size:].to(w_hh.dtype), db.to(x.dtype),
            dh0.to(h.dtype), dc0.to(c.dtype))


def _check_cell(op, input, w_ih, w_hh, h, c):
    check(input.dim() == 2, op, "input must be 2-D [B, I], got %d-D", input.dim())
    batch, in_size = input.shape
    check(w_hh.dim() == 2 and w_hh.shape[1] % 4 == 0 and w_hh.shape[1] > 0, op,
          "w_hh must be 2-D [hidden_size, 4*hidden_size], got %s", (tuple(w_hh.shape),))
    hidden = w_hh.shape[1] // 4
    check(tuple(w_hh.shape) == (hidden, 4 * hidden), op,
          "w_hh must be [hidden_size, 4*hidden_size] = %s, got %s", ((hidden, 4 * hidden), tuple(w_hh.shape)))
    check(tuple(w_ih.shape) == (in_size, 4 * hidden), op,
          "w_ih must be [input_size, 4*hidden_size] = %s, got %s", ((in_size, 4 * hidden), tuple(w_ih.shape)))
    for name, t in (("h", h), ("c", c)):
        check(tuple(t.shape) == (batch, hidden), op,
              "%s must be [B, hidden_size] = %s, got %s", (name, (batch, hidden), tuple(t.shape)))
    for name, t in (("input", input), ("w_ih", w_ih), ("w_hh", w_hh), ("h", h), ("c", c)):
        _check_float(op, name, t, input.dtype)
    return hidden


@impl("npu_lstm_cell")
def npu_lstm_cell(input, w_ih, w_hh, h, c, b_ih=None, b_hh=None):
    """One LSTM step; returns (y [1, B, H], h [B, H], c [B, H], i, j, f, o, tanhc [1, B, H])."""
    op = "npu_lstm_cell"
    hidden = _check_cell(op, input, w_ih, w_hh, h, c)
    bias = None
    if b_ih is not None:  # as op-plugin: the bias is b_ih + b_hh, and only when b_ih is given
        check(b_hh is not None, op, "b_hh must be given together with b_ih")
        for name, t in (("b_ih", b_ih), ("b_hh", b_hh)):
            check(tuple(t.shape) == (4 * hidden,), op,
                  "%s must be [4*hidden_size] = %s, got %s", (name, (4 * hidden,), tuple(t.shape)))
        bias = (b_ih + b_hh).to(input.dtype)
    return _gates_in_nz(_LstmCell.apply(input, w_ih, w_hh, h, c, bias), op)


@impl("npu_lstm_cell_backward")
def npu_lstm_cell_backward(grady, gradh, gradc, input, w_ih, w_hh, h, c, y_output, h_output, c_output, i, j, f, o,
                           tanhc):
    """Gradients (input, w_ih, w_hh, b_ih, b_hh, h, c) of npu_lstm_cell; the bias gradient is returned
    for both b_ih and b_hh, as the real op does."""
    _check_cell("npu_lstm_cell_backward", input, w_ih, w_hh, h, c)
    d_x, d_wih, d_whh, d_bias, d_h, d_c = _cell_grads(grady, gradh, gradc, input, w_ih, w_hh, h, c, y_output,
                                                      c_output.unsqueeze(0), i, j, f, o, tanhc)
    return d_x, d_wih, d_whh, d_bias, d_bias.clone(), d_h, d_c
