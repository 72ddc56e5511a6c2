"""torch_npu's integer dtype constants (torch_npu._C._cd.DType): values and use as op arguments.

The expected values are CANN's aclDataType numbers (acl_base.h) plus 256, written out here
independently of the implementation's table.
"""
import pytest
import torch

import torch_npu

ACL_DATA_TYPE = {
    "float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6, "uint16": 7,
    "uint32": 8, "int64": 9, "uint64": 10, "float64": 11, "bool": 12, "string": 13,
    "complex64": 16, "complex128": 17, "bfloat16": 27, "int4": 29, "uint1": 30, "complex32": 33,
    "hifloat8": 34, "float8_e5m2": 35, "float8_e4m3fn": 36, "float8_e8m0fnu": 37,
    "float6_e3m2": 38, "float6_e2m3": 39, "float4_e2m1fn_x2": 40, "float4_e1m2fn_x2": 41,
}


def test_dtype_class_lists_the_27_constants():
    from torch_npu._C._cd import DType
    names = sorted(n for n in dir(DType) if not n.startswith("_"))
    assert names == sorted(ACL_DATA_TYPE)


@pytest.mark.parametrize("name", sorted(ACL_DATA_TYPE))
def test_constant_value_and_export(name):
    value = getattr(torch_npu._C._cd.DType, name)
    assert value == ACL_DATA_TYPE[name] + 256
    assert getattr(torch_npu, name) == value
    assert type(getattr(torch_npu, name)) is int


def test_schema_defaults_use_the_same_codes():
    # npu_anti_mx_quant's schema default src_type is float8_e4m3fn, npu_quant_max's dst_dtype float8_e5m2.
    schema = torch.ops.npu.npu_anti_mx_quant.default._schema
    src_type = next(a for a in schema.arguments if a.name == "src_type")
    assert src_type.default_value == torch_npu.float8_e4m3fn
    schema = torch.ops.npu.npu_quant_max.default._schema
    dst = next(a for a in schema.arguments if a.name == "dst_dtype")
    assert dst.default_value == torch_npu.float8_e5m2


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_npu_dtype_code_selects_the_same_output_as_torch_dtype(device):
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(-5, 5, (3, 8), generator=g, dtype=torch.int8).to(device)
    x2 = torch.randint(-5, 5, (8, 4), generator=g, dtype=torch.int8).to(device)
    scale = torch.rand(4, generator=g).to(device)
    by_code = torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=torch_npu.bfloat16)
    assert by_code.dtype == torch.bfloat16
    ref = (x1.double().cpu() @ x2.double().cpu()) * scale.double().cpu()
    torch.testing.assert_close(by_code.cpu().double(), ref, rtol=1e-2, atol=1e-2)


def test_dtype_without_torch_equivalent_raises_naming_it():
    x1 = torch.ones(2, 4, dtype=torch.int8, device="npu")
    x2 = torch.ones(4, 2, dtype=torch.int8, device="npu")
    scale = torch.ones(2, device="npu")
    with pytest.raises(NotImplementedError, match=r"output_dtype=torch_npu\.hifloat8"):
        torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=torch_npu.hifloat8)
