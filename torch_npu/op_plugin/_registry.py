"""The ``npu`` operator library: every torch_npu 2.13.0 custom-op schema, defined once.

* ``define_all()`` defines each schema of ``_schemas.SCHEMAS`` in the ``npu``
  namespace (``torch.ops.npu.*``) through one ``torch.library.Library("npu",
  "DEF")`` that this module keeps alive. A schema PyTorch rejects is recorded in
  ``FAILED`` (name -> error text) instead of aborting the import.
* ``impl(name)`` registers an emulated implementation as a
  ``CompositeImplicitAutograd`` Python kernel built from ATen ops, so one
  function serves CPU and npu tensors, Meta/FakeTensor shape inference and
  autograd.
* ``register_not_emulated()`` gives every remaining overload CPU and
  PrivateUse1 (npu) kernels that raise ``NotImplementedError`` naming the op,
  never a silent wrong answer, and the Meta kernel registered for it with
  ``meta(name)`` (its output shapes and dtypes, from the op's documentation), so
  that FakeTensor tracing and ``torch.compile`` can see through an op whose
  computation is not emulated yet.

Every emulated kernel is registered through ``_guarded`` (see there): its dimension
arguments are checked against the rank of the tensor they index before the kernel
runs, and a Python error that escapes the emulation without naming the op becomes
an error that names it.
"""
import torch

from torch_npu.op_plugin._schemas import SCHEMAS, SOURCE_ROWS

__all__ = []

NAMESPACE = "npu"

# name -> (public, sections, schema, tensor_input) for each defined overload, in schema order.
DEFINED = {}
# name -> error text for schemas PyTorch refused to parse or register.
FAILED = {}
# name -> the Python function registered as its CompositeImplicitAutograd kernel.
IMPLEMENTED = {}
# names whose kernels raise NotImplementedError.
NOT_EMULATED = []
# name -> Meta kernel (output shapes/dtypes only) of an overload that is not emulated.
META = {}
# names of emulated overloads registered opaque (CPU/npu kernels + fake kernel), see opaque().
OPAQUE = set()

_LIB = None


def _library():
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library(NAMESPACE, "DEF")
    return _LIB


def define_all():
    lib = _library()
    for name, public, sections, schema, tensor_input in SCHEMAS:
        try:
            lib.define(schema)
        except Exception as exc:  # recorded and reported, the rest still loads
            FAILED[name] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        else:
            DEFINED[name] = (public, sections, schema, tensor_input)


def base_name(name):
    return name.split(".", 1)[0]


def not_emulated_message(name):
    return ("torch_npu.%s (npu::%s) is not emulated yet on the CPU-emulated NPU."
            % (base_name(name), name))


# Integer arguments that index a dimension of a tensor. Other ``*_dim`` names in the
# schemas are sizes (``rope_head_dim``, ``output_dim``, ``attn_dim_per_head``), and
# ``*_axis_mask`` are bit masks, so the rule is by exact name or the ``_axis`` suffix.
_DIM_ARGUMENT_NAMES = frozenset({"dim", "axis", "activate_dim"})
# List arguments that give the shape the dimension refers to, where it is not the first
# tensor's (``npu_max_backward(grad, dim, indices, sizes, keepdim)``: grad lacks ``dim``).
_SHAPE_ARGUMENT_NAMES = frozenset({"sizes", "self_size"})
# Python errors that an emulation never raises on purpose: a bare one means an argument
# the kernel did not expect (wrong rank, wrong layout, missing key), not a bug to hide.
_INTERNAL_ERRORS = (IndexError, KeyError, AttributeError, ZeroDivisionError, UnboundLocalError)


# Errors raised again, same type, with the op's name when their message lacks it.
_RENAMED_ERRORS = (TypeError, ValueError, NotImplementedError)


def _is_dim_argument(argument):
    return (str(argument.type) in ("int", "Optional[int]")
            and (argument.name in _DIM_ARGUMENT_NAMES or argument.name.endswith("_axis")))


def _dim_checks(name):
    """The (argument, position, reference, reference position) pairs to range-check for ``name``.

    Positions are the Python kernel's positional indexes (the dispatcher passes keyword-only
    arguments as keywords, and leaves out trailing arguments equal to their defaults), or
    None for a keyword-only argument. Ops whose first tensor argument is a Tensor[] are not
    checked (no single rank to check against).
    """
    schema = torch._C.parse_schema(DEFINED[name][2])
    positions = {}
    for i, a in enumerate(schema.arguments):
        positions[a.name] = None if a.kwarg_only else i
    reference = next((a for a in schema.arguments if a.name in _SHAPE_ARGUMENT_NAMES), None)
    if reference is None:
        reference = next((a for a in schema.arguments if "Tensor" in str(a.type)), None)
        if reference is None or str(reference.type) not in ("Tensor", "Optional[Tensor]"):
            return ()
    return tuple((a.name, positions[a.name], reference.name, positions[reference.name])
                 for a in schema.arguments if _is_dim_argument(a))


def _describe(value):
    if isinstance(value, torch.Tensor):
        return "Tensor(size=%s, %s, %s)" % (tuple(value.shape), str(value.dtype).replace("torch.", ""),
                                            value.device)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return "[%s]" % ", ".join(_describe(v) for v in value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _call_summary(args, kwargs):
    parts = [_describe(a) for a in args] + ["%s=%s" % (k, _describe(v)) for k, v in kwargs.items()]
    return "(%s)" % ", ".join(parts)


def _check_dims(op, checks, args, kwargs):
    n = len(args)
    for arg_name, position, ref_name, ref_position in checks:
        value = args[position] if position is not None and position < n else kwargs.get(arg_name)
        if value.__class__ is not int:
            continue  # absent (left at its default), or symbolic: the kernel decides
        ref = args[ref_position] if ref_position is not None and ref_position < n else kwargs.get(ref_name)
        if isinstance(ref, torch.Tensor):
            rank = ref.dim()
        elif isinstance(ref, (list, tuple)):
            rank = len(ref)
        else:
            continue
        bound = rank if rank > 0 else 1  # a 0-d tensor takes dim 0 / -1, as in ATen
        if not -bound <= value < bound:
            raise RuntimeError("%s: %s=%d is out of range for %s of rank %d (expected in [%d, %d])"
                               % (op, arg_name, value, ref_name, rank, -bound, bound - 1))


def _guarded(name, fn):
    """``fn`` as registered for ``npu::<name>``: dimension arguments range-checked first, and
    errors that escape the emulation naming the op.

    The rule for escaping errors: IndexError, KeyError, AttributeError, ZeroDivisionError and
    UnboundLocalError (never raised on purpose) become a RuntimeError naming the op and the
    arguments' shapes and dtypes; a TypeError, ValueError or NotImplementedError (ATen's
    "not implemented for 'Int'" on a wrong dtype) whose message does not name the op is
    raised again, same type, with that prefix (a wrong Python type stays a TypeError);
    errors that name the op, and other RuntimeErrors, pass unchanged. The
    original error is chained (``from``). What to check is computed here, once per op.
    """
    op = "torch_npu.%s" % base_name(name)
    checks = _dim_checks(name)
    short = base_name(name)

    def guarded(*args, **kwargs):
        if checks:
            _check_dims(op, checks, args, kwargs)
        try:
            return fn(*args, **kwargs)
        except _INTERNAL_ERRORS as e:
            raise RuntimeError("%s%s failed on its arguments: %s: %s" % (
                op, _call_summary(args, kwargs), type(e).__name__, e)) from e
        except (TypeError, ValueError, NotImplementedError) as e:
            if type(e) not in _RENAMED_ERRORS or short in str(e):
                raise
            raise type(e)("%s%s: %s" % (op, _call_summary(args, kwargs), e)) from e

    guarded.__name__ = guarded.__qualname__ = getattr(fn, "__name__", short)
    guarded.__doc__, guarded.__module__ = fn.__doc__, fn.__module__
    guarded.__wrapped__ = fn
    return guarded


def impl(name):
    """Decorator: register ``fn`` as the CompositeImplicitAutograd kernel of ``npu::<name>``."""
    def register(fn):
        if name not in DEFINED:
            raise RuntimeError("npu::%s has no schema to implement (%s)" % (name, FAILED.get(name, "unknown op")))
        if name in IMPLEMENTED:
            raise RuntimeError("npu::%s is implemented twice" % name)
        _library().impl(name, _guarded(name, fn), "CompositeImplicitAutograd")
        IMPLEMENTED[name] = fn
        return fn
    return register


def opaque(name, fake):
    """Decorator: register ``fn`` as the CPU and PrivateUse1 (npu) kernel of ``npu::<name>`` and
    ``fake`` as its FakeTensor/Meta kernel, for an op whose result depends on tensor *values* in a
    way ATen ops cannot trace (host reads such as NMS selections, data-dependent output sizes,
    collectives). A CompositeImplicitAutograd kernel would be decomposed under ``torch.compile``
    and whatever it computes on FakeTensors baked into the graph; an opaque op stays one node of
    the graph and runs ``fn`` on the real tensors. ``fake`` returns outputs of the right shape
    and dtype (``torch.library.get_ctx().new_dynamic_size()`` for data-dependent sizes). No
    autograd: the op must not need a backward (or register one with ``torch.library.register_autograd``)."""
    def register(fn):
        if name not in DEFINED:
            raise RuntimeError("npu::%s has no schema to implement (%s)" % (name, FAILED.get(name, "unknown op")))
        if name in IMPLEMENTED:
            raise RuntimeError("npu::%s is implemented twice" % name)
        lib = _library()
        kernel = _guarded(name, fn)
        lib.impl(name, kernel, "CPU")
        lib.impl(name, kernel, "PrivateUse1")
        if not DEFINED[name][3]:
            lib.impl(name, kernel, "BackendSelect")
        torch.library.register_fake("%s::%s" % (NAMESPACE, name), _guarded(name, fake), lib=lib)
        IMPLEMENTED[name] = fn
        OPAQUE.add(name)
        return fn
    return register


def opaque_kernel(name, kernel):
    """Register ``npu::<name>`` opaque from one ``kernel(shapes_only, *args, **kwargs)`` that runs
    the same checks either way and, with ``shapes_only``, returns empty outputs of the right shapes
    (the fake kernel) instead of computing. Returns the real kernel."""
    def real(*args, **kwargs):
        return kernel(False, *args, **kwargs)

    def fake(*args, **kwargs):
        return kernel(True, *args, **kwargs)

    real.__name__ = real.__qualname__ = name
    real.__doc__, real.__module__ = kernel.__doc__, kernel.__module__
    return opaque(name, fake=fake)(real)


def meta(name):
    """Decorator: ``fn`` computes the outputs of ``npu::<name>`` on Meta tensors (shapes and
    dtypes, as the real op documents them). Registered for the Meta key only while the op
    is not emulated; an emulated op's CompositeImplicitAutograd kernel already covers Meta."""
    def register(fn):
        if name not in DEFINED:
            raise RuntimeError("npu::%s has no schema (%s)" % (name, FAILED.get(name, "unknown op")))
        if name in META:
            raise RuntimeError("npu::%s has two Meta kernels" % name)
        META[name] = fn
        return fn
    return register


def _raising_kernel(name):
    message = not_emulated_message(name)

    def not_emulated(*args, **kwargs):
        raise NotImplementedError(message)

    not_emulated.__name__ = "not_emulated_" + name.replace(".", "_")
    not_emulated.__doc__ = message
    return not_emulated


def register_not_emulated():
    """CPU and npu kernels that raise NotImplementedError, for every overload without an implementation.

    Ops without Tensor inputs (factories such as ``empty_with_format``) have no
    tensor to select a backend from; the dispatcher only passes BackendSelect for
    them, so the same kernel is registered there too.
    """
    lib = _library()
    for name in DEFINED:
        if name in IMPLEMENTED:
            continue
        kernel = _raising_kernel(name)
        lib.impl(name, kernel, "CPU")
        lib.impl(name, kernel, "PrivateUse1")
        if not DEFINED[name][3]:
            lib.impl(name, kernel, "BackendSelect")
        if name in META:
            lib.impl(name, META[name], "Meta")
        NOT_EMULATED.append(name)


def summary():
    """Counts for reports and docs."""
    bases = {base_name(n) for n in DEFINED}
    impl_bases = {base_name(n) for n in IMPLEMENTED}
    return {
        "source_rows": SOURCE_ROWS,
        "overloads": len(SCHEMAS),
        "defined": len(DEFINED),
        "failed": len(FAILED),
        "base_names": len(bases),
        "public_base_names": len({base_name(n) for n, v in DEFINED.items() if v[0]}),
        "emulated_overloads": len(IMPLEMENTED),
        "emulated_base_names": len(impl_bases),
        "not_emulated_overloads": len(NOT_EMULATED),
        "meta_only_overloads": len([n for n in NOT_EMULATED if n in META]),
    }
