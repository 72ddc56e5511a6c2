"""Pieces of ``torch_npu.contrib.transfer_to_npu`` (private).

- ``rewrite``   — turning CUDA device/backends arguments into NPU ones, with a record
  of every rewrite (what the ``preflight`` command reports as hidden CUDA references);
- ``targets``   — the lists of functions whose arguments get rewritten;
- ``proxies``   — ``torch.Generator`` / ``torch.Event`` classes that rewrite the device;
- ``libraries`` — the client-library shims (transformers, trl, peft, accelerate).
"""
