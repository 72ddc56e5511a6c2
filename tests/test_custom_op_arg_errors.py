"""Every emulated custom op names itself when its arguments are wrong.

Two guards of ``torch_npu.op_plugin._registry`` are checked over the whole registry
(every emulated ``npu::`` overload, enumerated, not a hand-picked list):

* dimension arguments (``dim``, ``axis``, ``*_axis``, ``activate_dim``) are range-checked
  against the rank of the tensor they index before the kernel runs: a RuntimeError
  ``torch_npu.<op>: <arg>=<v> is out of range for <tensor> of rank <r> (expected in [-r, r-1])``;
* arguments generated from each schema with wrong ranks (0-d, 1-d, 5-d) and wrong dtypes
  (int32, bool) never let a bare IndexError / KeyError / AttributeError escape. The rule
  the guard enforces: errors are RuntimeError, NotImplementedError, or a ValueError /
  TypeError; a ValueError / TypeError / NotImplementedError names the op (a RuntimeError
  from ATen or the dispatcher may not).

The sweep runs in a subprocess, which reports op by op, so a crash (a signal) is caught
and attributed to the op that was running.
"""
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_npu
from torch_npu.op_plugin import _registry

from _subproc import REPO, make_env

_SWEEP = textwrap.dedent(r'''
    import json, sys, torch, torch_npu
    from torch_npu.op_plugin import _registry

    out = open(sys.argv[1], "w", buffering=1)
    variants = {
        "rank0": lambda: torch.randn(()),
        "rank1": lambda: torch.randn(4),
        "rank5": lambda: torch.randn(2, 2, 2, 2, 2),
        "int32": lambda: torch.ones(2, 4, dtype=torch.int32),
        "bool": lambda: torch.ones(2, 4, dtype=torch.bool),
    }
    SIMPLE = {"int": 1, "SymInt": 1, "float": 1.0, "bool": False, "str": "x", "Scalar": 1.0,
              "ScalarType": torch.float32, "int[]": [1], "SymInt[]": [2, 4], "float[]": [1.0],
              "bool[]": [False], "Device": torch.device("cpu"), "Layout": torch.strided,
              "MemoryFormat": torch.contiguous_format, "Generator": None}

    def value(a, make):
        t = str(a.type)
        if a.has_default_value():
            return None, False
        if t == "Tensor":
            return make(), True
        if t == "List[Tensor]":
            return [make()], True
        if t.startswith("Optional["):
            return None, True
        simple = {"int": 1, "float": 1.0, "bool": False, "str": "x", "number": 1.0, "ScalarType": torch.float32,
                  "List[int]": [2, 4], "List[float]": [1.0], "List[bool]": [False], "Device": torch.device("cpu"),
                  "Layout": torch.strided, "MemoryFormat": torch.contiguous_format}
        if t in simple:
            return simple[t], True
        return None, True

    for name in sorted(_registry.IMPLEMENTED):
        schema = torch._C.parse_schema(_registry.DEFINED[name][2])
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.npu, packet), overload or "default")
        for variant, make in variants.items():
            args, kwargs = [], {}
            for a in schema.arguments:
                v, given = value(a, make)
                if not given:
                    continue
                if a.kwarg_only:
                    kwargs[a.name] = v
                else:
                    args.append(v)
            out.write(json.dumps({"op": name, "variant": variant, "start": True}) + "\n")
            try:
                op(*args, **kwargs)
                outcome = {"error": None}
            except BaseException as e:
                outcome = {"error": type(e).__name__, "bases": [c.__name__ for c in type(e).__mro__],
                           "message": str(e)[:400]}
            out.write(json.dumps(dict(op=name, variant=variant, **outcome)) + "\n")
    out.write(json.dumps({"done": True}) + "\n")
''')


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "results.jsonl"
    r = subprocess.run([sys.executable, "-c", _SWEEP, str(path)], cwd=str(REPO), env=make_env(),
                       capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    last = rows[-1]
    assert r.returncode == 0 and last.get("done"), (
        f"the sweep died (status {r.returncode}) while running {last}:\n{r.stderr[-3000:]}")
    return [row for row in rows if "error" in row]


def test_sweep_covers_every_emulated_op(sweep):
    assert {row["op"] for row in sweep} == set(_registry.IMPLEMENTED)
    assert len(_registry.IMPLEMENTED) > 300


def test_wrong_ranks_and_dtypes_raise_errors_that_name_the_op(sweep):
    bad = []
    for row in sweep:
        if row["error"] is None:
            continue
        base = _registry.base_name(row["op"])
        bases = set(row["bases"])
        if bases & {"IndexError", "KeyError", "AttributeError", "ZeroDivisionError", "NameError"}:
            bad.append(row)
        elif not bases & {"RuntimeError", "ValueError", "TypeError", "NotImplementedError"}:
            bad.append(row)
        elif row["error"] in ("ValueError", "TypeError", "NotImplementedError") and base not in row["message"]:
            bad.append(row)
    assert not bad, f"{len(bad)} bad:\n" + "\n".join(f"{r['op']} [{r['variant']}]: {r['error']}: {r['message'][:200]}" for r in bad[:40])


def test_swiglu_dim_out_of_range_names_op_argument_and_range():
    x = torch.randn(2, 4).npu()
    with pytest.raises(RuntimeError) as info:
        torch_npu.npu_swiglu(x, dim=5)
    assert str(info.value) == "torch_npu.npu_swiglu: dim=5 is out of range for self of rank 2 (expected in [-2, 1])"
    with pytest.raises(RuntimeError, match=r"dim=-3 is out of range for self of rank 2 \(expected in \[-2, 1\]\)"):
        torch_npu.npu_swiglu(x, dim=-3)
    # in range, both signs: the same result as the CPU formula
    a, b = x.cpu().chunk(2, dim=-1)
    expected = torch.nn.functional.silu(a) * b
    assert torch.equal(torch_npu.npu_swiglu(x, dim=1).cpu(), expected)
    assert torch.equal(torch_npu.npu_swiglu(x, dim=-1).cpu(), expected)


def _ops_with_dim_checks():
    return [(name, checks) for name in sorted(_registry.IMPLEMENTED)
            if (checks := _registry._dim_checks(name))]


def test_dimension_rule_picks_dims_not_sizes():
    """``dim``/``axis``/``*_axis``/``activate_dim`` index a dimension; ``rope_head_dim``,
    ``output_dim`` or ``shrink_axis_mask`` are sizes and masks and are not range-checked."""
    names = {arg for _, checks in _ops_with_dim_checks() for arg, *_ in checks}
    assert names == {"dim", "axis", "quant_axis", "activate_dim"}
    checks = dict(_ops_with_dim_checks())
    assert checks["npu_max_backward"][0][2] == "sizes"  # grad lacks the reduced dim
    assert "npu_scatter_list" not in checks  # a Tensor[] has no single rank


@pytest.mark.parametrize("name,checks", _ops_with_dim_checks(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_dimension_argument_is_range_checked_before_the_kernel(name, checks):
    schema = torch._C.parse_schema(_registry.DEFINED[name][2])
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.npu, packet), overload or "default")
    for arg_name, _, ref_name, _ in checks:
        kwargs = {}
        for a in schema.arguments:
            t = str(a.type)
            if a.name == arg_name:
                v = 9
            elif a.name == ref_name and t.startswith("List"):
                v = [2, 4, 6]
            elif "Tensor" in t:
                v = None if t.startswith("Optional") else ([torch.randn(2, 4, 6)] if t.startswith("List")
                                                            else torch.randn(2, 4, 6))
            elif a.has_default_value():
                continue
            else:
                v = {"int": 1, "float": 1.0, "bool": False, "str": "update", "number": 1.0,
                     "ScalarType": torch.float32, "List[int]": [2, 4, 6]}[t]
            kwargs[a.name] = v  # by name: arguments left at their defaults are skipped
        with pytest.raises(RuntimeError) as info:
            op(**kwargs)
        assert str(info.value).startswith(
            f"torch_npu.{packet}: {arg_name}=9 is out of range for {ref_name} of rank 3 (expected in [-3, 2])"), \
            str(info.value)
