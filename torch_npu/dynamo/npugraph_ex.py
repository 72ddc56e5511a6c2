"""npugraph_ex: torch_npu's aclgraph backend module (``import npugraph_ex``).

The backend itself is the dynamo backend ``"npugraph_ex"``; this module gives
``npugraph_ex.get_npugraph_ex_backend()`` for code that builds it by hand.
"""
__all__ = ["get_npugraph_ex_backend"]


def get_npugraph_ex_backend(options=None):
    def backend(gm, example_inputs, **kwargs):
        from torch_npu._inductor import compile_fx_npu
        return compile_fx_npu(gm, example_inputs)
    return backend
