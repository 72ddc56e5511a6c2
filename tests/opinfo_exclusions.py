"""Every exclusion of the OpInfo differential sweep (tests/test_opinfo_sweep.py).

ONE dict, ``EXCLUSIONS = {op_variant_name: reason}``. Keys are OpInfo variant
names as the sweep prints them: ``op.name`` or ``op.name + "." + variant_test_name``.
The reason's prefix says what is excluded:

``RANDOM: ...`` / ``UNINITIALIZED: ...`` / ``NONDETERMINISTIC: ...``
    Values cannot be compared (random number generation, memory that is never
    written, or results that vary from run to run even on the CPU). The op
    still runs on both devices, forward and backward, but only shape, dtype,
    layout and device of outputs and grads are compared -- for every sample,
    or, where ``SAMPLE_FILTERS`` has the op, only for the samples its
    predicate picks (e.g. dropout with p > 0 in training mode); the other
    samples are compared exactly.
``UNSUPPORTED: ...``
    Not run at all: nothing to compare -- the op has no CPU kernel in this
    build (CUDA-only), or it needs a feature torch_npu leaves out by design
    (sparse tensors).
``BUG: ... (reported)``
    A torch_npu bug, reported. The op still runs; its failures are expected and
    do not fail the test. If every sample passes, the test fails and asks for
    the entry to be removed (strict expected failure).

Anything not listed here is compared exactly (rtol=0, atol=0, equal_nan=True).

Two helper tables refine entries (they exclude nothing by themselves):
``SAMPLE_FILTERS`` narrows a shape/dtype/device-only entry to some samples, and
``CPU_ARGUMENTS`` names ops whose sample args must stay on CPU on every device
(compared exactly).
"""

_RNG = "RANDOM: draws random numbers; the npu generator's stream differs from the CPU one"
_DROPOUT = "RANDOM: dropout (some samples have p > 0 in training mode)"
_UNINIT = "UNINITIALIZED: returns uninitialized memory"
_SPARSE = "UNSUPPORTED: sparse layouts are not supported on npu (by design)"
_NO_CPU = "UNSUPPORTED: no CPU dtypes (CUDA-only kernel), nothing to run on this build"

EXCLUSIONS = {
    # -- random number generation: shape/dtype/device only ------------------
    "bernoulli": _RNG,
    "cauchy": _RNG,
    "exponential": _RNG,
    "geometric": _RNG,
    "log_normal": _RNG,
    "multinomial": _RNG,
    "normal": _RNG,
    "normal.in_place": _RNG,
    "normal.number_mean": _RNG,
    "uniform": _RNG,
    "rand_like": _RNG,
    "randint": _RNG,
    "randint_like": _RNG,
    "randn": _RNG,
    "randn_like": _RNG,
    "nn.functional.rrelu": _RNG + " (random slopes in training mode)",
    "nn.functional.fractional_max_pool2d": _RNG + " (random pooling regions when _random_samples is not given)",
    "nn.functional.fractional_max_pool3d": _RNG + " (random pooling regions when _random_samples is not given)",
    "svd_lowrank": _RNG + " (random projection, torch.randn inside)",
    "pca_lowrank": _RNG + " (random projection, torch.randn inside)",
    "nn.functional.dropout": _DROPOUT,
    "nn.functional.dropout2d": _DROPOUT,
    "nn.functional.dropout3d": _DROPOUT,
    "nn.functional.alpha_dropout": _DROPOUT,
    "nn.functional.feature_alpha_dropout.with_train": _DROPOUT,
    "nn.functional.multi_head_attention_forward": _DROPOUT + " (dropout_p > 0 and training=True)",
    "nn.functional.scaled_dot_product_attention": _DROPOUT + " (dropout_p > 0)",
    # -- nondeterministic even on CPU: shape/dtype/device only --------------
    "linalg.lstsq": "NONDETERMINISTIC: driver='gelsy' (MKL) results vary in the last bits with memory "
                    "placement, even between two CPU runs",
    "linalg.lstsq.grad_oriented": "NONDETERMINISTIC: driver='gelsy' (MKL) results vary in the last bits with "
                                  "memory placement, even between two CPU runs",
    # -- uninitialized memory: shape/dtype/device only ----------------------
    "empty": _UNINIT,
    "empty_like": _UNINIT,
    "empty_permuted": _UNINIT,
    "empty_strided": _UNINIT,
    "new_empty": _UNINIT,
    "new_empty_strided": _UNINIT,
    # -- not run ------------------------------------------------------------
    "to_sparse": _SPARSE,
    "sparse.mm.reduce": _SPARSE,
    "sparse.sampled_addmm": _SPARSE,
    "nn.functional.batch_norm.without_cudnn": _NO_CPU,
    "torch.ops.aten._efficient_attention_forward": _NO_CPU,
    "torch.ops.aten._flash_attention_forward": _NO_CPU,
}

# Not exclusions: harness adaptations, still compared exactly. For these ops
# the sample's args/kwargs tensors stay on CPU (only sample.input moves to npu),
# because the op requires them on CPU on every device, as the OpInfo samples do.
CPU_ARGUMENTS = {
    "tensor_split": "tensor_indices_or_sections must be a CPU tensor (the sample creates it on CPU for any device)",
}


def _bound(fn_name, sample):
    """The sample's arguments to torch.nn.functional.<fn_name>, by parameter name."""
    import inspect

    import torch.nn.functional as F
    ba = inspect.signature(getattr(F, fn_name)).bind(sample.input, *sample.args, **sample.kwargs)
    ba.apply_defaults()
    return ba.arguments


def _dropout_active(fn_name, p="p"):
    return lambda s: bool(_bound(fn_name, s)["training"]) and _bound(fn_name, s)[p] > 0


# {op variant: predicate(sample)}: for a shape/dtype/device-only entry of
# EXCLUSIONS, the predicate picks the samples so compared (True); its other
# samples are compared exactly. Entries not here: every sample so compared.
SAMPLE_FILTERS = {
    "nn.functional.dropout": _dropout_active("dropout"),
    "nn.functional.dropout2d": _dropout_active("dropout2d"),
    "nn.functional.dropout3d": _dropout_active("dropout3d"),
    "nn.functional.alpha_dropout": _dropout_active("alpha_dropout"),
    "nn.functional.feature_alpha_dropout.with_train": _dropout_active("feature_alpha_dropout"),
    "nn.functional.rrelu": lambda s: bool(_bound("rrelu", s)["training"]),
    "nn.functional.multi_head_attention_forward": _dropout_active("multi_head_attention_forward", "dropout_p"),
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    "linalg.lstsq": lambda s: s.kwargs.get("driver") == "gelsy",
    "linalg.lstsq.grad_oriented": lambda s: s.kwargs.get("driver") == "gelsy",
}


def sample_values_excluded(name, sample):
    """For an op of kind "meta": whether this sample skips the value comparison."""
    pred = SAMPLE_FILTERS.get(name)
    return True if pred is None else bool(pred(sample))


_META_PREFIXES = ("RANDOM:", "UNINITIALIZED:", "NONDETERMINISTIC:")
_SKIP_PREFIXES = ("UNSUPPORTED:",)
_KNOWN_FAILURE_PREFIXES = ("BUG:",)


def kind_of(name):
    """"exact" (not excluded), "meta", "skip" or "known_failure"."""
    reason = EXCLUSIONS.get(name)
    if reason is None:
        return "exact"
    if reason.startswith(_META_PREFIXES):
        return "meta"
    if reason.startswith(_SKIP_PREFIXES):
        return "skip"
    if reason.startswith(_KNOWN_FAILURE_PREFIXES):
        return "known_failure"
    raise ValueError(f"opinfo_exclusions: reason for {name!r} has no known prefix: {reason!r}")
