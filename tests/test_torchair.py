"""torchair's package layout and the imports and calls its documentation uses.

``import torchair`` is ``torch_npu.dynamo.torchair``; every ``torchair.x.y``
must be the very module ``torch_npu.dynamo.torchair.x.y`` (a copy would
carry a second ``CompilerConfig`` class that the backend rejects).
"""
import importlib
import logging
import sys

import pytest
import torch

import torch_npu
import torchair

NPU = torch.device("npu")

# __all__ of the real torch_npu 2.13.0's torchair modules
# (reference module_all_lists.json), for the modules laid out here.
REAL_ALL = {
    "": ["get_compiler", "get_npu_backend", "dynamo_export", "CompilerConfig", "use_internal_format_weight",
         "logger", "register_fx_node_ge_converter", "patch_for_hcom", "register_replacement",
         "npu_format_cast_via_cpu"],
    "configs.compiler_config": ["CompilerConfig"],
    "configs.aoe_config": [], "configs.debug_config": [], "configs.dump_config": [],
    "configs.experimental_config": [], "configs.export_config": [], "configs.fusion_config": [],
    "configs.ge_config": [], "configs.inference_config": [],
    "core.utils": [],
    "experimental.inference": ["use_internal_format_weight", "npu_format_cast_via_cpu"],
    "inference": ["cache_compile", "readable_cache", "set_dim_gears"],
    "npu_export": ["dynamo_export"],
    "npu_fx_compiler": ["get_npu_backend", "get_compiler"],
    "patterns.pattern_pass_manager": ["register_replacement"],
}


@pytest.mark.parametrize("sub", sorted(REAL_ALL))
def test_module_is_the_bundled_one_with_the_real_all(sub):
    alias = importlib.import_module("torchair" + ("." + sub if sub else ""))
    bundled = importlib.import_module("torch_npu.dynamo.torchair" + ("." + sub if sub else ""))
    assert alias is bundled
    assert sys.modules["torchair" + ("." + sub if sub else "")] is bundled
    assert sorted(bundled.__all__) == sorted(REAL_ALL[sub])
    for name in bundled.__all__:
        assert hasattr(bundled, name), name


def test_documented_imports_name_the_same_objects():
    from torchair.configs.compiler_config import CompilerConfig
    from torchair.core.utils import logger
    from torchair.npu_fx_compiler import get_npu_backend, get_compiler
    from torchair.npu_export import dynamo_export
    from torchair.experimental.inference import use_internal_format_weight
    from torchair.inference import cache_compile, readable_cache, set_dim_gears
    from torchair.patterns.pattern_pass_manager import register_replacement
    import torchair.inference
    assert CompilerConfig is torchair.CompilerConfig
    assert logger is torchair.logger and logger.name == "torchair"
    assert (get_npu_backend, get_compiler, dynamo_export) == (
        torchair.get_npu_backend, torchair.get_compiler, torchair.dynamo_export)
    assert use_internal_format_weight is torchair.use_internal_format_weight
    assert register_replacement is torchair.register_replacement
    assert torchair.inference.cache_compile is cache_compile is torch_npu.npu.npugraph_ex.inference.cache_compile
    assert readable_cache is torch_npu.npu.npugraph_ex.inference.readable_cache
    assert callable(set_dim_gears)
    # The path used before the configs package existed keeps working.
    from torch_npu.dynamo.torchair.configs import CompilerConfig as old_path
    assert old_path is CompilerConfig
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torchair.no_such_module")


def _fn(x):
    return torch.relu(x) * 2 + x.sum()


def test_documented_backend_usage_compiles_on_npu():
    # torchair's documented pattern, with the config from its documented import.
    from torchair.configs.compiler_config import CompilerConfig
    import torch._dynamo
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.experimental_config.frozen_parameter = True
    npu_backend = torchair.get_npu_backend(compiler_config=config)
    assert npu_backend.compiler_config.as_dict()["experimental_config"]["frozen_parameter"] is True
    x = torch.randn(6, 3)
    torch._dynamo.reset()
    try:
        out = torch.compile(_fn, backend=npu_backend, dynamic=False)(x.to(NPU))
    finally:
        torch._dynamo.reset()
    assert out.device.type == "npu"
    torch.testing.assert_close(out.cpu(), _fn(x))
    with pytest.raises(ValueError, match="optional list"):
        config.ge_config.oo_level = "O2"


def test_register_replacement_is_shared_with_npugraph_ex_and_applied_by_torchair():
    import torch._dynamo
    from torch_npu.npu.npugraph_ex import _replacements

    def fn(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(16, device="npu")
    saved = dict(_replacements._state)
    torch._dynamo.reset()
    try:
        # Deliberately not equivalent, so the result shows the rewrite ran.
        torchair.register_replacement(lambda a: torch.sin(a) * 2, lambda a: torch.cos(a) * 2, [torch.randn(4)])
        assert _replacements._state["count"] == saved["count"] + 1
        out = torch.compile(fn, backend=torchair.get_npu_backend())(x)
        torch.testing.assert_close(out.cpu(), torch.cos(x.cpu()) * 2 + 1)
    finally:
        _replacements._state.update(saved)
        torch._dynamo.reset()


def test_set_dim_gears_marks_the_dimensions_dynamic():
    from torchair.inference import set_dim_gears, get_dim_gears
    t = torch.randn(4, 8)
    with pytest.raises(AssertionError, match="The gears size at least 2"):
        set_dim_gears(t, {0: [4]})
    assert get_dim_gears(t) is None
    set_dim_gears(t, {0: [2, 4, 8]})
    assert get_dim_gears(t) == {0: [2, 4, 8]}
    assert t._dynamo_dynamic_indices == {0}


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_patch_for_hcom_only_warns():
    all_reduce = torch.distributed.all_reduce
    records = _Records()
    torchair.logger.addHandler(records)
    try:
        torchair.patch_for_hcom()
    finally:
        torchair.logger.removeHandler(records)
    assert records.messages == [
        "For versions 2.3.1 and above of PyTorch, there is no need to call patch_for_hcom anymore."]
    assert torch.distributed.all_reduce is all_reduce


def test_format_helpers():
    w = torch.randn(32, 16, device="npu", dtype=torch.float16)
    via_cpu = torchair.npu_format_cast_via_cpu(w, 29)
    assert torch_npu.get_npu_format(via_cpu) == torch_npu.get_npu_format(torch_npu.npu_format_cast(w, 29)) == 29
    assert torch.equal(via_cpu.cpu(), w.cpu())
    model = torch.nn.Linear(4, 4)
    assert torchair.use_internal_format_weight(model) is model


def test_register_fx_node_ge_converter_returns_the_converter():
    def converter(*args, **kwargs):
        raise AssertionError("GE converters are not called by the emulated backend")
    assert torchair.register_fx_node_ge_converter(torch.ops.aten.add.Tensor)(converter) is converter


def test_dynamo_export_writes_a_loadable_program(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    x = torch.randn(5, 3)
    path = torchair.dynamo_export(x, model=model, export_path=str(tmp_path), export_name="tiny")
    assert path == str(tmp_path / "tiny.pt2")
    loaded = torch.export.load(path)
    torch.testing.assert_close(loaded.module()(x), model(x))
