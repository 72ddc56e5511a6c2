"""``compile_fx``: the npugraph_ex backend's compile function."""
__all__ = ["compile_fx"]


def compile_fx(gm, example_inputs=None, options=None):
    """Compile a dynamo FX graph as ``torch.compile(backend="npugraph_ex")`` does; returns the callable.

    ``options`` (the backend's option dict) is checked and accepted; the
    emulated path has no aclgraph settings to apply them to.
    """
    from torch_npu._inductor import compile_fx_npu
    from torch_npu.npu.npugraph_ex._replacements import post_grad_pass
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
    if example_inputs is None:
        example_inputs = [node.meta["example_value"] for node in gm.graph.nodes
                          if node.op == "placeholder" and "example_value" in node.meta]
    user_pass = post_grad_pass()
    patches = {"post_grad_custom_pre_pass": user_pass} if user_pass is not None else None
    return compile_fx_npu(gm, list(example_inputs), config_patches=patches)
