"""Every exclusion of the conformance suite, with its reason (one place).

Only results that cannot be compared are excluded, never a difference in
behaviour: an excluded test is not run and is counted as "excluded" in the
summary. ``EXCLUSIONS`` maps an OpInfo variant name (``op.name`` or
``op.name.variant``, the names ``tests/opinfo_exclusions.py`` uses) or a
ModuleInfo name (``nn.Transformer``), or ``kind:name`` for one test kind
only, to its reason. A plain-name entry excludes the
test kinds that compare values (``VALUE_KINDS``); the kinds that compare only
whether a call raises, shapes, dtypes, devices or reprs still run.

Reasons (prefixes as in tests/opinfo_exclusions.py):
``RANDOM:``         the op draws random numbers: the npu generator is its own
                    stream (docs/architecture.md, NPUGenerator), so values differ
                    from the CPU's by design, as on every accelerator;
``UNINITIALIZED:``  the result is memory that is never written (empty*);
``NONDETERMINISTIC:`` results vary between two CPU runs already;
``UNSUPPORTED:``    nothing to compare: no CPU kernel in this build, or sparse
                    tensors, which torch_npu leaves out.
The op-level entries are the OpInfo sweep's (tests/opinfo_exclusions.py) of
these kinds, so both suites exclude the same ops for the same reasons.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import opinfo_exclusions  # noqa: E402

# Test kinds whose checks compare values with the CPU's.
VALUE_KINDS = frozenset({
    "out", "out_warning", "variant_consistency", "noncontiguous_samples", "conj_view", "neg_view",
    "forward", "inplace", "pickle", "non_contiguous_tensors", "grad",
})

_MODULE_DROPOUT = "RANDOM: dropout in training mode draws a mask from the npu generator"

EXCLUSIONS = {
    **{name: reason for name, reason in opinfo_exclusions.EXCLUSIONS.items()
       if opinfo_exclusions.kind_of(name) in ("meta", "skip")},
    # -- modules with dropout > 0 (random in training mode) ----------------
    # -- one test kind only ("kind:name") ---------------------------------
    "out:mode": "UNSUPPORTED: mode.values is upstream's CompositeExplicitAutograd mode_out, which accepts only "
                "CPU, CUDA and XPU tensors: it raises for any PrivateUse1 device, as on the real torch_npu "
                "(mode.values has no NPU kernel there either)",
    "out_warning:mode": "UNSUPPORTED: mode.values rejects PrivateUse1 devices upstream (see out:mode)",
    "dtypes:histc": "UNSUPPORTED: the NPU's histc counts integer tensors (aclnnHistc takes INT8-INT64 and UINT8), "
                    "which the CPU kernel refuses; transformers' MoE experts rely on it on every non-CPU device. "
                    "The dtypes test compares with the CPU's claims (tests/test_ops_histc_integer.py checks the "
                    "integer counts)",
    "nn.TransformerEncoderLayer": _MODULE_DROPOUT + " (dropout > 0 by default)",
    "nn.TransformerDecoderLayer": _MODULE_DROPOUT + " (dropout > 0 by default)",
    "nn.TransformerEncoder": _MODULE_DROPOUT + " (dropout > 0 by default)",
    "nn.Transformer": _MODULE_DROPOUT + " (dropout > 0 by default)",
    "nn.MultiheadAttention": _MODULE_DROPOUT + " (some inputs set dropout > 0)",
}


# Not exclusions: known npu bugs, owned elsewhere, reported. Their tests run;
# failures are expected (counted as "known") and do not fail the kind, but an
# entry none of whose tests fails in a run fails the driver (remove it then).
# Keys and kinds as for EXCLUSIONS (plain names: the VALUE_KINDS).
KNOWN_FAILURES = {}


def known_failure(kind, name):
    """The KNOWN_FAILURES entry key for test kind ``kind`` of ``name``, or None."""
    for key in (f"{kind}:{name}", name):
        if key in KNOWN_FAILURES and (":" in key or kind in VALUE_KINDS):
            return key
    return None


def reason_for(kind, name):
    """The exclusion reason of test kind ``kind`` for op/module ``name``, or None (it runs).
    UNSUPPORTED entries exclude every kind; the others the VALUE_KINDS."""
    reason = EXCLUSIONS.get(f"{kind}:{name}") or EXCLUSIONS.get(name)
    if reason is None or (kind not in VALUE_KINDS and not reason.startswith("UNSUPPORTED:")):
        return None
    return reason
