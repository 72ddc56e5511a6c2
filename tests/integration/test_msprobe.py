"""msprobe (mindstudio-probe) on npu: PrecisionDebugger dumps one training step in
exact and in chip numerics, `msprobe compare` points at the APIs chip mode changed.

References: the exact run is bitwise the CPU (the dumped CRC32 of the conv
output equals that of the CPU conv computed here); chip mode rounds the inputs
of fp32 convolutions (torch.npu.conv.allow_hf32, default True) and, with
torch.npu.matmul.allow_hf32 set, of matmuls, so those APIs, and only those, have
matching inputs and differing outputs.
"""
import concurrent.futures
import os
import zlib

import pytest
import torch
import torch.nn.functional as F

from _clients import load_example, require

require("msprobe")

example = load_example("msprobe_precision_compare")

CONV = "Functional.conv2d.0.forward"
FC = "Functional.linear.0.forward"        # the vector branch's Linear
RMS_NORM = "NPU.npu_rms_norm.0.forward"   # a torch_npu API, hooked as "NPU.*"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("msprobe")
    plan = {  # name: (numerics, matmul.allow_hf32, summary mode); each dump is its own process
        "exact": ("exact", False, "md5"),
        "exact_again": ("exact", False, "md5"),
        "chip": ("chip", False, "md5"),
        "chip_matmul_hf32": ("chip", True, "md5"),
        "exact_stats": ("exact", False, "statistics"),
        "chip_stats": ("chip", False, "statistics"),
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(plan), (os.cpu_count() or 2) // 2))) as pool:
        futures = {name: pool.submit(example.run_dump, numerics, str(root / name), hf32, mode)
                   for name, (numerics, hf32, mode) in plan.items()}
        dumps = {name: f.result() for name, f in futures.items()}

    def compare(target, golden):
        csv_path = example.msprobe_compare(dumps[target], dumps[golden], str(root / f"cmp_{target}"))
        return csv_path, example.read_compare(csv_path)

    return {"dumps": dumps, "compare": compare}


def _dump_data(path):
    import json
    with open(path) as f:
        return json.load(f)["data"]


def test_exact_dump_records_the_cpu_result_bitwise(runs):
    model, (image, vector, target) = example._model_and_batch()
    with torch.no_grad():
        ref = F.conv2d(image, model.conv.weight, model.conv.bias)
    want = f"{zlib.crc32(ref.contiguous().numpy().tobytes()):08x}"
    data = _dump_data(runs["dumps"]["exact"])
    assert data[CONV]["output"][0]["md5"] == want
    assert data[CONV]["output"][0]["shape"] == list(ref.shape)
    assert _dump_data(runs["dumps"]["chip"])[CONV]["output"][0]["md5"] != want


def test_exact_against_exact_everything_matches(runs):
    csv_path, apis = runs["compare"]("exact_again", "exact")
    assert {CONV, FC, RMS_NORM, "Functional.conv2d.0.backward", "Functional.cross_entropy.0.forward"} <= set(apis)
    assert all(all(e["input"]) and all(e["output"]) for e in apis.values()), csv_path
    assert example.drift_origins(apis) == []


def test_chip_mode_drift_starts_at_the_convolution(runs):
    csv_path, apis = runs["compare"]("chip", "exact")
    # Default switches: conv.allow_hf32 True, matmul.allow_hf32 False.
    assert example.drift_origins(apis) == [CONV], csv_path
    # The vector branch does not depend on the conv: it matches bit for bit.
    for api in (RMS_NORM, FC, "Functional.relu.1.forward"):
        assert all(apis[api]["input"]) and all(apis[api]["output"]), api
    # Everything downstream of the conv differs.
    assert not all(apis["Functional.relu.0.forward"]["input"])
    assert not all(apis["Functional.linear.1.forward"]["input"])
    assert not all(apis["Functional.cross_entropy.0.forward"]["output"])


def test_chip_mode_with_matmul_hf32_also_points_at_the_linear(runs):
    csv_path, apis = runs["compare"]("chip_matmul_hf32", "exact")
    assert example.drift_origins(apis) == sorted([CONV, FC]), csv_path
    assert all(apis[RMS_NORM]["input"]) and all(apis[RMS_NORM]["output"])


def test_statistics_dump_shows_the_size_of_the_conv_drift(runs):
    import csv
    csv_path, apis = runs["compare"]("chip_stats", "exact_stats")
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    first_diff = next(r["NPU Name"] for r in rows if not example.row_matches(r))
    assert first_diff == CONV + ".output.0"
    conv_out = next(r for r in rows if r["NPU Name"] == CONV + ".output.0")
    # HF32 keeps 11 of fp32's 23 stored mantissa bits: the conv output's L2 norm
    # moves, by far less than 1 %.
    assert float(conv_out["L2norm diff"]) != 0
    assert 0 < float(conv_out["NormRelativeErr"].rstrip("%")) < 1.0
    for api in (RMS_NORM, FC):
        assert all(apis[api]["input"]) and all(apis[api]["output"]), api
