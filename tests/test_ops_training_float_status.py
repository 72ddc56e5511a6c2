"""Float-status ops (torch_npu/op_plugin/training/float_status.py): 8-element float32 status, the
emulated register shared with torch.npu's overflow-flag APIs. Written on torch_npu.testing's
TestCase, as the real project's op tests are."""
import numpy as np
import torch

import torch_npu
from torch_npu.npu import _overflow
from torch_npu.testing.common_utils import create_common_tensor
from torch_npu.testing.testcase import run_tests, TestCase


class TestFloatStatus(TestCase):
    def test_alloc_get_clear(self):
        cpu_x, npu_x = create_common_tensor([np.float32, -1, (1, 2, 3)], -1, 1)
        for x in (cpu_x, npu_x):
            with self.subTest(device=x.device.type):
                status = torch_npu.npu_alloc_float_status(x)
                self.assertEqual(status.dtype, torch.float32)
                self.assertEqual(status.device.type, x.device.type)
                self.assertEqual(status.cpu().tolist(), [0.0] * 8)
                self.assertEqual(torch_npu.npu_get_float_status(status).cpu().tolist(), [0.0] * 8)
                self.assertEqual(torch_npu.npu_clear_float_status(status).cpu().tolist(), [0.0] * 8)

    def test_register_is_read_and_cleared(self):
        status = torch_npu.npu_alloc_float_status(torch.rand(2).npu())
        _overflow._float_status[0] = True  # what a saturating kernel would do
        try:
            self.assertEqual(torch_npu.npu_get_float_status(status).cpu().tolist(), [1.0] + [0.0] * 7)
            torch_npu.npu_clear_float_status(status)
            self.assertIs(_overflow._float_status[0], False)
            self.assertEqual(torch_npu.npu_get_float_status(status).cpu().tolist(), [0.0] * 8)
        finally:
            _overflow._float_status[0] = False

    def test_compiled_graph_reads_and_clears_at_run_time(self):
        # traced with the flag clear; the compiled graph must still read the flag set later,
        # and clear it even though the clear's result is unused
        status = torch_npu.npu_alloc_float_status(torch.rand(2).npu())

        def step(s):
            flag = torch_npu.npu_get_float_status(s)
            torch_npu.npu_clear_float_status(s)
            return flag * 2

        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        try:
            self.assertEqual(compiled(status).cpu().tolist(), [0.0] * 8)
            _overflow._float_status[0] = True
            self.assertEqual(compiled(status).cpu().tolist(), [2.0] + [0.0] * 7)
            self.assertIs(_overflow._float_status[0], False)
        finally:
            _overflow._float_status[0] = False

    def test_meta(self):
        out = torch_npu.npu_get_float_status(torch.empty(8, device="meta"))
        self.assertEqual(out.shape, (8,))
        self.assertEqual(out.device.type, "meta")


if __name__ == "__main__":
    run_tests()
