"""``torch_npu.distributed.tensor``: DTensor extras for the NPU (context parallelism)."""
