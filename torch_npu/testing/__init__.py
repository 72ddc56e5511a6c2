"""torch_npu.testing: the test harness of torch_npu (same module paths as the
real wheel), so test files written for it import and run unchanged.

- ``testcase``: ``TestCase`` (seeded, ``assertRtolEqual``…) and ``run_tests``.
- ``common_utils``: tensor factories, device/CANN gates, RNG and profiler helpers.
- ``common_distributed``: multi-NPU gates, ``init_pg``, ``with_comms``.
- ``decorator``: ``instantiate_tests``, ``Dtypes``, ``Formats``.

Importing this package also adapts ``torch.testing._internal`` to the npu
device (see ``_patch_torch_testing``).
"""
from torch_npu.testing import _patch_torch_testing

_patch_torch_testing.apply()
