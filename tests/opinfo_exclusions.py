"""Every exclusion of the OpInfo differential sweep (tests/test_opinfo_sweep.py).

ONE dict, ``EXCLUSIONS = {op_variant_name: reason}``. Keys are OpInfo variant
names as the sweep prints them: ``op.name`` or ``op.name + "." + variant_test_name``.
The reason's prefix says what is excluded:

``RANDOM: ...`` / ``UNINITIALIZED: ...``
    Values cannot be compared (random number generation, or memory that is
    never written). The op still runs on both devices, forward and backward,
    but only shape, dtype, layout and device of outputs and grads are compared.
``UNSUPPORTED: ...``
    Not run at all: the op cannot run on this CPU-only build (e.g. a CUDA-only
    kernel with no CPU dtypes), so there is nothing to compare.
``BUG: ... (reported)``
    A torch_npu bug, reported. The op still runs; its failures are expected and
    do not fail the test. If every sample passes, the test fails and asks for
    the entry to be removed (strict expected failure).

Anything not listed here is compared exactly (rtol=0, atol=0, equal_nan=True).
"""

_RNG = "RANDOM: draws random numbers; the npu generator's stream differs from the CPU one"
_DROPOUT = "RANDOM: dropout (some samples have p > 0 in training mode)"
_UNINIT = "UNINITIALIZED: returns uninitialized memory"
_SPARSE = "UNSUPPORTED: sparse layouts are not supported on npu (by design: clear NotImplementedError)"
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
    "nn.functional.multi_head_attention_forward": _DROPOUT + " (dropout_p=0.5, training=True sample)",
    "nn.functional.scaled_dot_product_attention": _DROPOUT + " (dropout_p=0.5 sample)",
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
    # -- torch_npu bugs (run, failures expected; strict) ---------------------
    "sgn": "BUG: backward segfaults: torch._efficientzerotensor on npu crashes in adopt_storage (reported)",
    "nn.functional.mish": "BUG: mish_backward on npu runs the CompositeImplicitAutograd math decomposition, "
                          "not the CPU kernel: grads differ by 1 ulp (reported)",
}

# Not exclusions: harness adaptations, still compared exactly. For these ops
# the sample's args/kwargs tensors stay on CPU (only sample.input moves to npu),
# because the op requires them on CPU on every device, as the OpInfo samples do.
CPU_ARGUMENTS = {
    "tensor_split": "tensor_indices_or_sections must be a CPU tensor (the sample creates it on CPU for any device)",
}

_META_PREFIXES = ("RANDOM:", "UNINITIALIZED:")
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
