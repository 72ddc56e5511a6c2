"""Worker of the OpInfo differential sweep (see tests/test_opinfo_sweep.py).

Runs OpInfo variants from ``torch.testing._internal.common_methods_invocations.op_db``
on CPU tensors and on the same inputs moved to ``npu``, and compares the results.

Usage::

    python tests/opinfo_sweep_worker.py --list
        one line per OpInfo variant name (``op.name`` or ``op.name.variant``)
    python tests/opinfo_sweep_worker.py --ops name1,name2,...
    python tests/opinfo_sweep_worker.py --ops-json '["name1", "name2"]'
        runs the named variants; for each prints, flushed,
            OPINFO_SWEEP_START <name>
            OPINFO_SWEEP_AT <phase> sample <i>     (before each sample)
            OPINFO_SWEEP_RESULT <json>
        The JSON object has: op, dtype, mode ("exact" | "meta" | "known_failure"),
        passed (samples), failed (list of {sample, phase, msg}), notes,
        meta_samples (samples compared by shape/dtype/device only), seconds.

Per op variant: up to MAX_SAMPLES (3) samples of ``op.sample_inputs("cpu", dtype)``
compared forward ("fwd": outputs, and the inputs after the op, for in-place and
out= ops); for differentiable ops also up to 3 samples built with
requires_grad=True ("grad": outputs, then the grads of a weighted sum of the
float outputs w.r.t. the sample's leaf tensors). dtype is float32, or the first
supported of DTYPE_PREFERENCE.

Environment knobs (exploration; the test's defaults need none of them):
    TORCH_NPU_SWEEP_DTYPE=float64      try this dtype first
    TORCH_NPU_SWEEP_MAX_SAMPLES=1000   more samples per op variant
    TORCH_NPU_SWEEP_STRIDES=0          do not compare strides/storage offsets

The process runs single-threaded (``torch.set_num_threads(1)``) so that CPU and
npu executions run the very same kernels with the same reduction order; results
must then be bitwise equal.
"""
import argparse
import json
import os
import sys
import time
import traceback
import warnings
import zlib

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
import torch_npu  # noqa: E402,F401
from torch.utils import _pytree as pytree  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opinfo_exclusions  # noqa: E402

MAX_SAMPLES = int(os.environ.get("TORCH_NPU_SWEEP_MAX_SAMPLES", "3"))
CHECK_STRIDES = os.environ.get("TORCH_NPU_SWEEP_STRIDES", "1") != "0"
MSG_LEN = 600
NPU = "npu"

# Preferred sample dtype: float32; ops without float32 support fall back in order.
DTYPE_PREFERENCE = (torch.float32, torch.complex64, torch.int64, torch.int32, torch.bool,
                    torch.float64, torch.uint8, torch.int16, torch.int8, torch.float16, torch.bfloat16)


def variant_name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def load_ops():
    from torch.testing._internal.common_methods_invocations import op_db
    return {variant_name(op): op for op in op_db}


def pick_dtype(op):
    supported = op.supported_dtypes("cpu")
    # TORCH_NPU_SWEEP_DTYPE=float64 (say) tries that dtype first; default float32.
    first = os.environ.get("TORCH_NPU_SWEEP_DTYPE")
    if first and getattr(torch, first, None) in supported:
        return getattr(torch, first)
    for dt in DTYPE_PREFERENCE:
        if dt in supported:
            return dt
    if supported:
        return sorted(supported, key=str)[0]
    return None


def op_seed(name):
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


# ---------------------------------------------------------------------------
# Moving inputs to npu
# ---------------------------------------------------------------------------
def _storage_key(x):
    try:
        st = x.untyped_storage()
        return (st.data_ptr(), st.nbytes())
    except Exception:  # noqa: BLE001  (no storage: sparse, nested, ...)
        return None


def _replicable(x):
    return (type(x) is torch.Tensor or isinstance(x, torch.nn.Parameter)) and x.layout == torch.strided \
        and not x.is_conj() and not x.is_neg() and _storage_key(x) is not None


def to_npu_tree(tree, memo, keep_args_on_cpu=False, device=NPU):
    """Copy every tensor of ``tree`` (``(input, args, kwargs)``) to npu (or ``device``:
    the conformance suite runs its checks on a CPU copy too; copies are always fresh).

    Returns ``(npu_tree, moved)``; ``moved`` is False when the sample has no
    tensor and no device argument, so that outputs rightly stay on CPU.

    ``x.detach().to("npu")``, made a fresh leaf that requires grad where ``x``
    did. Where ``.to`` would not reproduce ``x``'s layout -- a view with an
    offset or into a larger storage, non-dense strides (slices with steps,
    expanded dims) -- or where several inputs share one storage, the whole CPU
    storage is copied once and the npu tensor is set to the same
    sizes/strides/offset on it, so the npu op sees exactly the CPU layout and
    aliasing. The same tensor maps to the same npu tensor (``memo``: id ->
    (cpu, npu)). ``"cpu"`` strings and ``torch.device("cpu")`` (device
    arguments) become npu. With ``keep_args_on_cpu`` only tensors of the
    sample's input move; those in args/kwargs stay on CPU.
    """
    leaves = [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]
    users = {}
    for x in {id(x): x for x in leaves}.values():
        key = _storage_key(x)
        if key is not None and key[1] > 0:
            users[key] = users.get(key, 0) + 1
    storages = {}
    moved = [False]

    def move(x):
        t = x.detach().to(device, copy=True)
        if _replicable(x):
            key = _storage_key(x)
            if (users.get(key, 0) > 1 or t.stride() != x.stride() or t.storage_offset() != x.storage_offset()
                    or t.untyped_storage().nbytes() != key[1]):
                if key not in storages:
                    flat = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
                    storages[key] = flat.to(device, copy=True).untyped_storage()
                t = torch.empty(0, dtype=x.dtype, device=device).set_(
                    storages[key], x.storage_offset(), x.size(), x.stride())
        if x.requires_grad:
            t.requires_grad_(True)
        return t

    def conv(x):
        if isinstance(x, (torch.Tensor, torch.device)) or (isinstance(x, str) and x == "cpu"):
            moved[0] = True
        if isinstance(x, torch.Tensor):
            key = id(x)
            if key not in memo:
                memo[key] = (x, move(x))
            return memo[key][1]
        if isinstance(x, torch.device) and x.type == "cpu":
            return torch.device(device)
        if isinstance(x, str) and x == "cpu":
            return device
        return x

    def conv_device_only(x):
        return conv(x) if not isinstance(x, torch.Tensor) else x

    inp, args, kwargs = tree
    rest = conv_device_only if keep_args_on_cpu else conv
    out = (pytree.tree_map(conv, inp), pytree.tree_map(rest, args), pytree.tree_map(rest, kwargs))
    # Nothing to move (e.g. arange(5) without a device): outputs stay on CPU.
    return out, moved[0]


def sample_tree(sample):
    return (sample.input, list(sample.args), dict(sample.kwargs))


def call_op(op, tree):
    inp, args, kwargs = tree
    return op(inp, *args, **kwargs)


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------
class Mismatch(AssertionError):
    pass


def _short(e):
    s = "".join(traceback.format_exception_only(type(e), e)).strip()
    return s[:MSG_LEN]


def compare(npu, cpu, meta_only, path="out", on_npu=True, device=NPU):
    """Raise Mismatch unless ``npu`` (a result on ``device``) equals the CPU result ``cpu``."""
    if isinstance(cpu, torch.Tensor):
        if not isinstance(npu, torch.Tensor):
            raise Mismatch(f"{path}: cpu gave a Tensor, npu gave {type(npu).__name__}")
        want_dev = device if cpu.device.type == "cpu" and on_npu else cpu.device.type
        if npu.device.type != want_dev:
            raise Mismatch(f"{path}: expected device {want_dev}, got {npu.device}")
        if meta_only:
            if npu.shape != cpu.shape or npu.dtype != cpu.dtype or npu.layout != cpu.layout:
                raise Mismatch(f"{path}: meta mismatch npu {tuple(npu.shape)} {npu.dtype} {npu.layout} "
                               f"vs cpu {tuple(cpu.shape)} {cpu.dtype} {cpu.layout}")
            return
        if CHECK_STRIDES and cpu.layout == torch.strided and npu.numel() > 1 and (
                npu.stride() != cpu.stride() or npu.storage_offset() != cpu.storage_offset()):
            raise Mismatch(f"{path}: layout differs: npu stride {npu.stride()} offset {npu.storage_offset()}, "
                           f"cpu stride {cpu.stride()} offset {cpu.storage_offset()}")
        other = npu.detach().cpu()
        try:
            torch.testing.assert_close(other, cpu.detach(), rtol=0, atol=0, equal_nan=True)
        except AssertionError as e:
            raise Mismatch(f"{path}: {str(e).strip()}") from None
        return
    if isinstance(cpu, (list, tuple)):
        if not isinstance(npu, (list, tuple)) or len(npu) != len(cpu):
            raise Mismatch(f"{path}: cpu gave {type(cpu).__name__} of len {len(cpu)}, npu gave {type(npu).__name__}"
                           f"{' of len %d' % len(npu) if isinstance(npu, (list, tuple)) else ''}")
        for i, (n, c) in enumerate(zip(npu, cpu)):
            compare(n, c, meta_only, f"{path}[{i}]", on_npu, device)
        return
    if isinstance(cpu, dict):
        if not isinstance(npu, dict) or set(npu) != set(cpu):
            raise Mismatch(f"{path}: dict keys differ")
        for k in cpu:
            compare(npu[k], cpu[k], meta_only, f"{path}[{k!r}]", on_npu, device)
        return
    if isinstance(cpu, float) and isinstance(npu, float) and cpu != cpu and npu != npu:
        return  # both NaN
    if isinstance(cpu, complex) and isinstance(npu, complex):
        if (cpu == npu) or (cpu != cpu and npu != npu):
            return
    if meta_only and isinstance(cpu, (int, float, complex, bool)) and type(cpu) is type(npu):
        return  # e.g. .item() of a random tensor
    if isinstance(cpu, torch.device):
        want = torch.device(device, 0) if cpu.type == "cpu" and on_npu and device == NPU else cpu
        if not (npu == want or (isinstance(npu, torch.device) and npu.type == want.type)):
            raise Mismatch(f"{path}: device {npu} vs expected {want}")
        return
    try:
        eq = type(npu) is type(cpu) and npu == cpu
    except Exception as e:  # noqa: BLE001
        raise Mismatch(f"{path}: could not compare {type(cpu).__name__}: {_short(e)}") from None
    if not eq:
        raise Mismatch(f"{path}: {npu!r} (npu) != {cpu!r} (cpu)")


def run_both(op, cpu_tree, npu_tree):
    """Run op on CPU and npu. Returns (cpu_out, npu_out, cpu_exc, npu_exc)."""
    cpu_out = npu_out = cpu_exc = npu_exc = None
    try:
        cpu_out = call_op(op, cpu_tree)
    except Exception as e:  # noqa: BLE001
        cpu_exc = e
    try:
        npu_out = call_op(op, npu_tree)
    except Exception as e:  # noqa: BLE001
        npu_exc = e
    return cpu_out, npu_out, cpu_exc, npu_exc


def check_exceptions(cpu_exc, npu_exc):
    """None when both ran; "both" when both raised; else raises Mismatch."""
    if cpu_exc is None and npu_exc is None:
        return None
    if cpu_exc is not None and npu_exc is not None:
        if type(cpu_exc) is not type(npu_exc):
            raise Mismatch(f"both raised, but different exceptions: cpu {_short(cpu_exc)} / npu {_short(npu_exc)}")
        return "both"
    if npu_exc is not None:
        raise Mismatch(f"npu raised, cpu did not: {_short(npu_exc)}")
    raise Mismatch(f"cpu raised, npu did not: {_short(cpu_exc)}")


def tensor_leaves(tree):
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def grad_outputs(out):
    return [t for t in tensor_leaves(out)
            if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)]


def weight_dtype(t):
    # At least float32 (the CPU has no sum for e.g. ComplexHalf).
    return torch.promote_types(t.dtype, torch.float32)


def scalar_loss(outs, weights):
    total = None
    for o, w in zip(outs, weights):
        term = (o.to(w.dtype) * w).sum()
        if term.is_complex():
            term = term.real
        total = term if total is None else total + term
    return total


# ---------------------------------------------------------------------------
# One op variant
# ---------------------------------------------------------------------------
def run_forward_sample(op, sample, meta_only, cpu_args):
    memo = {}
    cpu_tree = sample_tree(sample)
    npu_tree, on_npu = to_npu_tree(cpu_tree, memo, cpu_args)
    cpu_out, npu_out, cpu_exc, npu_exc = run_both(op, cpu_tree, npu_tree)
    if check_exceptions(cpu_exc, npu_exc) == "both":
        return "both raised"
    compare(npu_out, cpu_out, meta_only, on_npu=on_npu)
    # In-place / out= ops: the (possibly mutated) inputs must agree as well.
    for i, (cpu_t, npu_t) in enumerate(memo.values()):
        compare(npu_t, cpu_t, meta_only, f"input#{i} after op")
    return None


def run_grad_sample(op, sample, meta_only, seed, cpu_args):
    memo = {}
    cpu_tree = sample_tree(sample)
    npu_tree, on_npu = to_npu_tree(cpu_tree, memo, cpu_args)
    cpu_out, npu_out, cpu_exc, npu_exc = run_both(op, cpu_tree, npu_tree)
    if check_exceptions(cpu_exc, npu_exc) == "both":
        return "both raised"
    cpu_out = sample.output_process_fn_grad(cpu_out)
    npu_out = sample.output_process_fn_grad(npu_out)
    compare(npu_out, cpu_out, meta_only, on_npu=on_npu)

    # Grads w.r.t. the sample's own leaf tensors. A non-leaf input, or a view
    # of another tensor that requires grad (istft's sample passes
    # ``window[:8]`` made in no-grad mode: autograd gives it no grad on CPU),
    # is tied to a base outside the sample, while its npu copy is a fresh
    # leaf: not comparable, left out of the grad comparison.
    pairs = [(c, n) for c, n in memo.values() if c.requires_grad and c.is_leaf
             and not (c._is_view() and c._base is not None and c._base.requires_grad)]
    cpu_outs, npu_outs = grad_outputs(cpu_out), grad_outputs(npu_out)
    if len(cpu_outs) != len(npu_outs):
        raise Mismatch(f"{len(cpu_outs)} differentiable outputs on cpu, {len(npu_outs)} on npu")
    if not pairs or not cpu_outs:
        return "no differentiable inputs/outputs"
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, dtype=weight_dtype(o), generator=gen) for o in cpu_outs]
    cpu_in = [c for c, _ in pairs]
    npu_in = [n for _, n in pairs]
    cpu_g = npu_g = cpu_exc = npu_exc = None
    try:
        cpu_loss = scalar_loss(cpu_outs, weights)
        cpu_g = torch.autograd.grad(cpu_loss, cpu_in, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        cpu_exc = e
    try:
        npu_loss = scalar_loss(npu_outs, [w.to(NPU) for w in weights])
        npu_g = torch.autograd.grad(npu_loss, npu_in, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        npu_exc = e
    if check_exceptions(cpu_exc, npu_exc) == "both":
        return "backward: both raised"
    for i, (ng, cg) in enumerate(zip(npu_g, cpu_g)):
        if (ng is None) != (cg is None):
            raise Mismatch(f"grad[{i}]: {'npu' if ng is None else 'cpu'} grad is None, the other is not")
        if cg is not None:
            compare(ng, cg, meta_only, f"grad[{i}]")
    return None


def run_variant(name, op):
    t0 = time.time()
    res = {"op": name, "dtype": None, "mode": "exact", "passed": 0, "failed": [], "notes": [], "meta_samples": 0}
    kind = opinfo_exclusions.kind_of(name)
    if kind == "skip":
        res["mode"] = "skip"
        res["seconds"] = 0.0
        return res
    meta_only = kind == "meta"
    if meta_only:
        res["mode"] = "meta"
    elif kind == "known_failure":
        res["mode"] = "known_failure"
    cpu_args = name in opinfo_exclusions.CPU_ARGUMENTS
    dtype = pick_dtype(op)
    if dtype is None:
        res["failed"].append({"sample": -1, "phase": "setup", "msg": "op supports no dtype on CPU"})
        res["seconds"] = time.time() - t0
        return res
    res["dtype"] = str(dtype).replace("torch.", "")
    seed = op_seed(name)
    do_grad = (op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
               and dtype in op.supported_backward_dtypes("cpu"))
    phases = [("fwd", False)] + ([("grad", True)] if do_grad else [])
    for phase, requires_grad in phases:
        torch.manual_seed(seed)
        try:
            samples = []
            it = iter(op.sample_inputs("cpu", dtype, requires_grad=requires_grad))
            while len(samples) < MAX_SAMPLES:
                try:
                    samples.append(next(it))
                except StopIteration:
                    break
        except Exception as e:  # noqa: BLE001
            res["failed"].append({"sample": -1, "phase": phase, "msg": "sample_inputs raised: " + _short(e)})
            continue
        if not samples:
            res["notes"].append(f"{phase}: no samples")
        for i, sample in enumerate(samples):
            print(f"OPINFO_SWEEP_AT {phase} sample {i}", flush=True)  # names the sample if we crash
            torch.manual_seed(seed + i)
            try:
                meta = meta_only and opinfo_exclusions.sample_values_excluded(name, sample)
                res["meta_samples"] += int(meta)
                if phase == "fwd":
                    note = run_forward_sample(op, sample, meta, cpu_args)
                else:
                    note = run_grad_sample(op, sample, meta, seed + i, cpu_args)
                res["passed"] += 1
                if note:
                    res["notes"].append(f"{phase}[{i}]: {note}")
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip() if isinstance(e, Mismatch) else "unexpected " + _short(e)
                res["failed"].append({"sample": i, "phase": phase, "msg": msg[:MSG_LEN]})
    res["seconds"] = round(time.time() - t0, 3)
    return res


# ---------------------------------------------------------------------------
# Self-test ops: prove the harness catches what it must (tests/test_opinfo_sweep.py)
# ---------------------------------------------------------------------------
SELFTEST_PREFIX = "__selftest_"


class _WrongGradSin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        r = g * x.cos()
        return r + 1e-6 if r.device.type == NPU else r


def selftest_op(name, ops):
    """A copy of the ``sin`` OpInfo with a deliberately broken npu path."""
    import copy
    if name == "__selftest_segfault__":
        import ctypes
        ctypes.string_at(0)  # SIGSEGV, like a crashing kernel
    op = copy.copy(ops["sin"])
    if name == "__selftest_wrong_fwd__":
        op.op = lambda x: torch.sin(x) + (1e-6 if x.device.type == NPU else 0.0)
    elif name == "__selftest_wrong_grad__":
        op.op = _WrongGradSin.apply
    elif name == "__selftest_wrong_device__":
        op.op = lambda x: torch.sin(x).cpu()
    else:
        return None
    return op


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--ops", default=None, help="comma-separated op variant names")
    parser.add_argument("--ops-json", default=None, help="JSON list of op variant names")
    a = parser.parse_args(argv)

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    ops = load_ops()
    if a.list:
        for name in ops:
            print(name)
        return 0
    names = []
    if a.ops:
        names += [n for n in a.ops.split(",") if n]
    if a.ops_json:
        names += json.loads(a.ops_json)
    for name in names:
        print("OPINFO_SWEEP_START " + name, flush=True)
        if name.startswith(SELFTEST_PREFIX) and selftest_op(name, ops) is not None:
            res = run_variant(name, selftest_op(name, ops))
        elif name not in ops:
            res = {"op": name, "dtype": None, "mode": "exact", "passed": 0, "notes": [], "seconds": 0.0,
                   "failed": [{"sample": -1, "phase": "setup", "msg": "no such OpInfo variant in op_db"}]}
        else:
            res = run_variant(name, ops[name])
        print("OPINFO_SWEEP_RESULT " + json.dumps(res), flush=True)
    print("OPINFO_SWEEP_DONE", flush=True)
    # Skip interpreter finalization: the npu autograd device thread may drop the
    # last reference to a GraphTask (holding Python-owned tensors) while Python
    # finalizes, and abort the process ("terminate called without an active
    # exception"; PyTorch's known exit race with autograd device threads).
    # Every result is printed by now.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
