"""torch.npu.amp (autocast / GradScaler / custom_fwd / custom_bwd) and overflow-flag APIs."""
import inspect
import warnings

import pytest
import torch

import torch_npu


def _pair(*shape, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return x, x.npu()


def test_module_layout_and_all():
    assert torch.npu.amp is torch_npu.npu.amp
    assert torch_npu.npu.amp.__all__ == ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]
    from torch_npu.npu.amp import autocast_mode, grad_scaler, common
    assert autocast_mode.__all__ == ["autocast", "custom_fwd", "custom_bwd"]
    assert grad_scaler.GradScaler is torch.npu.amp.GradScaler
    assert common.amp_definitely_not_available() is False
    for name in ("get_npu_overflow_flag", "clear_npu_overflow_flag"):
        assert name in torch_npu.npu.__all__ and hasattr(torch.npu, name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_context_manager_matches_explicit_casts(dtype):
    a, an = _pair(8, 16, seed=1)
    b, bn = _pair(16, 4, seed=2)
    assert issubclass(torch.npu.amp.autocast, torch.amp.autocast_mode.autocast)
    with torch.npu.amp.autocast(dtype=dtype):
        assert torch.is_autocast_enabled("npu") and torch.get_autocast_dtype("npu") == dtype
        mm = an @ bn
        sm = torch.softmax(mm, -1)
    assert not torch.is_autocast_enabled("npu")
    ref = a.to(dtype) @ b.to(dtype)
    assert mm.dtype == dtype and mm.device.type == "npu"
    torch.testing.assert_close(mm.cpu(), ref, rtol=0, atol=0)
    assert sm.dtype == torch.float32
    torch.testing.assert_close(sm.cpu(), torch.softmax(ref.float(), -1), rtol=0, atol=0)


def test_autocast_default_dtype_decorator_and_nesting():
    a, an = _pair(4, 4, seed=3)

    @torch.npu.amp.autocast()
    def f(x):
        return x @ x

    out = f(an)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), a.half() @ a.half(), rtol=0, atol=0)
    assert not torch.is_autocast_enabled("npu")

    with torch.npu.amp.autocast():
        with torch.npu.amp.autocast(enabled=False):
            assert (an @ an).dtype == torch.float32
        with torch.npu.amp.autocast(dtype=torch.bfloat16):
            assert (an @ an).dtype == torch.bfloat16
        assert (an @ an).dtype == torch.float16
    assert (an @ an).dtype == torch.float32


def test_gradscaler_signature_defaults():
    sig = inspect.signature(torch.npu.amp.GradScaler)
    assert {k: v.default for k, v in sig.parameters.items()} == dict(
        init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
        dynamic=True, enabled=True)
    assert issubclass(torch.npu.amp.GradScaler, torch.amp.GradScaler)
    s = torch.npu.amp.GradScaler()
    assert s.is_enabled() and s.get_scale() == 65536.0 and s._device == "npu"


def _model(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Linear(4, 3).npu()
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def test_unscale_clip_step():
    m, opt = _model()
    x = torch.randn(5, 4).npu()
    scaler = torch.npu.amp.GradScaler(init_scale=1024.0)
    w0 = m.weight.detach().cpu().clone()
    with torch.npu.amp.autocast():
        loss = m(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaled_grad = m.weight.grad.detach().cpu().clone()
    scaler.unscale_(opt)
    grad = m.weight.grad.detach().cpu().clone()
    torch.testing.assert_close(grad, scaled_grad / 1024.0)
    torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=0.01)
    clipped = m.weight.grad.detach().cpu().clone()
    assert scaler.step(opt) is None
    scaler.update()
    torch.testing.assert_close(m.weight.detach().cpu(), w0 - 0.1 * clipped)
    assert scaler.get_scale() == 1024.0


def _inf_step(scaler, m, opt):
    opt.zero_grad()
    loss = (m(torch.ones(1, 4).npu()) * float("inf")).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def _good_step(scaler, m, opt):
    opt.zero_grad()
    scaler.scale(m(torch.ones(1, 4).npu()).sum()).backward()
    scaler.step(opt)
    scaler.update()


def test_inf_step_skipped_and_backoff():
    m, opt = _model()
    w0 = m.weight.detach().cpu().clone()
    scaler = torch.npu.amp.GradScaler(init_scale=256.0)
    _inf_step(scaler, m, opt)
    torch.testing.assert_close(m.weight.detach().cpu(), w0, rtol=0, atol=0)
    assert scaler.get_scale() == 128.0


def test_growth_after_interval():
    m, opt = _model()
    scaler = torch.npu.amp.GradScaler(init_scale=8.0, growth_factor=4.0, growth_interval=3)
    for i in range(3):
        assert scaler.get_scale() == 8.0
        _good_step(scaler, m, opt)
    assert scaler.get_scale() == 32.0
    assert scaler._get_growth_tracker() == 0


def test_static_scaling_dynamic_false():
    m, opt = _model()
    scaler = torch.npu.amp.GradScaler(init_scale=64.0, growth_interval=1, dynamic=False)
    w0 = m.weight.detach().cpu().clone()
    _inf_step(scaler, m, opt)
    torch.testing.assert_close(m.weight.detach().cpu(), w0, rtol=0, atol=0)  # still skipped
    assert scaler.get_scale() == 64.0
    _good_step(scaler, m, opt)
    _good_step(scaler, m, opt)
    assert scaler.get_scale() == 64.0
    assert not torch.equal(m.weight.detach().cpu(), w0)
    scaler.update(new_scale=16.0)
    assert scaler.get_scale() == 16.0


def test_state_dict_round_trip():
    m, opt = _model()
    s = torch.npu.amp.GradScaler(init_scale=32.0, growth_factor=3.0, backoff_factor=0.25,
                                 growth_interval=5, dynamic=False)
    _good_step(s, m, opt)
    sd = s.state_dict()
    assert sd["scale"] == 32.0 and sd["growth_factor"] == 3.0 and sd["dynamic"] is False
    t = torch.npu.amp.GradScaler()
    t.load_state_dict(sd)
    assert t.get_scale() == 32.0 and t.get_growth_factor() == 3.0
    assert t.get_backoff_factor() == 0.25 and t.get_growth_interval() == 5
    assert t._dynamic is False and t.state_dict() == sd


def test_disabled_when_npu_unavailable(monkeypatch):
    monkeypatch.setattr(torch_npu.npu, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="torch_npu.amp.GradScaler is enabled, but NPU is not available"):
        s = torch.npu.amp.GradScaler()
    assert not s.is_enabled()
    x = torch.ones(2)
    assert s.scale(x) is x


class _MyMM(torch.autograd.Function):
    @staticmethod
    @torch.npu.amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.fwd_enabled = torch.is_autocast_enabled("npu")
        return a.mm(b)

    @staticmethod
    @torch.npu.amp.custom_bwd
    def backward(ctx, grad):
        ctx.bwd_enabled = torch.is_autocast_enabled("npu")
        a, b = ctx.saved_tensors
        return grad.mm(b.t()), a.t().mm(grad)


def test_custom_fwd_bwd_inside_autocast():
    a, an = _pair(3, 4, seed=5)
    b, bn = _pair(4, 2, seed=6)
    an = an.half().requires_grad_()
    bn = bn.requires_grad_()
    with torch.npu.amp.autocast():
        out = _MyMM.apply(an, bn)
        assert out.dtype == torch.float32  # inputs cast to fp32, autocast disabled inside
        plain = an.float() @ bn
        assert plain.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), a.half().float() @ b, rtol=0, atol=0)
    out.sum().backward()
    assert an.grad.dtype == torch.float16 and bn.grad.dtype == torch.float32
    torch.testing.assert_close(bn.grad.cpu(), a.half().float().t() @ torch.ones(3, 2))
    assert out.grad_fn.fwd_enabled is False


def test_custom_fwd_without_cast_runs_under_autocast():
    @torch.npu.amp.custom_fwd
    def f(x):
        return torch.is_autocast_enabled("npu"), x @ x

    x = torch.ones(2, 2).npu()
    with torch.npu.amp.autocast():
        enabled, y = f(x)
    assert enabled and y.dtype == torch.float16


def test_overflow_apis_inf_nan_mode(monkeypatch):
    monkeypatch.delenv("INF_NAN_MODE_FORCE_DISABLE", raising=False)
    u = torch_npu.npu.utils
    assert torch.npu.get_device_name().startswith("Ascend910B")
    assert u.is_support_inf_nan() is True
    with pytest.raises(RuntimeError, match="please use npu_check_overflow"):
        torch.npu.get_npu_overflow_flag()
    with pytest.warns(UserWarning, match="clear_npu_overflow_flag is useless"):
        assert torch.npu.clear_npu_overflow_flag() is None
    with pytest.raises(RuntimeError):
        torch.npu.amp.GradScaler.get_npu_overflow_flag()
    assert u.npu_check_overflow(torch.ones(3).npu()) is False
    assert u.npu_check_overflow(torch.tensor([1.0, float("inf")]).npu()) is True
    assert u.npu_check_overflow(torch.tensor([float("nan")]).npu().half()) is True


def test_overflow_apis_forced_saturation_mode(monkeypatch):
    monkeypatch.setenv("INF_NAN_MODE_FORCE_DISABLE", "1")
    u = torch_npu.npu.utils
    assert u.is_support_inf_nan() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.npu.get_npu_overflow_flag() is False
        assert torch.npu.clear_npu_overflow_flag() is None
    assert u.npu_check_overflow(torch.ones(3).npu()) is False
