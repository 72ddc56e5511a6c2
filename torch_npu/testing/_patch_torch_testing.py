"""Make PyTorch's device-generic tests (``torch.testing._internal``) run on npu.

- Generic tests are instantiated for the npu only (CPU and CUDA variants
  excluded) unless the caller already chose with
  ``PYTORCH_TESTING_DEVICE_ONLY_FOR`` / ``PYTORCH_TESTING_DEVICE_EXCEPT_FOR``.
- ``onlyCUDA`` becomes ``onlyPRIVATEUSE1`` (tests written for "the
  accelerator" run on npu) and ``TEST_PRIVATEUSE1`` is True.

``TEST_CUDA`` stays False: tests behind it call ``torch.cuda`` directly,
which has no device here.
"""
import os
from torch_npu import _settings

_applied = False


def apply():
    global _applied
    if _applied:
        return
    _applied = True
    if not (_settings.is_set("PYTORCH_TESTING_DEVICE_ONLY_FOR")
            or _settings.is_set("PYTORCH_TESTING_DEVICE_EXCEPT_FOR")):
        os.environ["PYTORCH_TESTING_DEVICE_EXCEPT_FOR"] = "cuda,cpu"
    from torch.testing._internal import common_device_type, common_utils
    common_device_type.onlyCUDA = common_device_type.onlyPRIVATEUSE1
    common_utils.TEST_PRIVATEUSE1 = True
