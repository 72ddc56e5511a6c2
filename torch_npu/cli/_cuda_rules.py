"""Finding (and, where safe, fixing) CUDA-only constructs in one Python module.

One libcst pass over the syntax tree: names are resolved through the file's imports
(``import torch as th; th.cuda.X`` is ``torch.cuda.X``), strings are judged by their value,
comments and formatting are untouched. Every finding says what it is, where, and what to
use on the NPU; ``fixable`` ones are rewritten by ``check(source, fix=True)``.

Kinds:
  cuda-call            ``x.cuda(...)``                      -> ``x.npu(...)``
  is-cuda              ``x.is_cuda``                        -> ``x.is_npu``
  device-string        ``"cuda"``, ``"cuda:0"``, ``f"cuda:{i}"`` -> ``"npu…"``
  map-location         a CUDA device in ``map_location=``   -> NPU device
  pin-memory-device    ``pin_memory_device="cuda"``         -> ``"npu"``
  torch-cuda           ``torch.cuda.X``                     -> ``torch.npu.X``
  cuda-amp             ``torch.cuda.amp.X``                 -> ``torch.npu.amp.X``
  cudnn-flag           ``torch.backends.cudnn/cuda.*``      (no effect on the NPU; manual)
  nccl                 ``"nccl"``, ``"cuda:nccl"``          -> ``"hccl"``, ``"npu:hccl"``
  cuda-visible-devices ``"CUDA_VISIBLE_DEVICES"``           -> ``"ASCEND_RT_VISIBLE_DEVICES"``
  cuda-library         flash_attn, apex, xformers, bitsandbytes, triton, CUDAExtension,
                       cpp_extension.load(… .cu) / load_inline(cuda_sources=…)       (manual)
  data-parallel        ``nn.DataParallel``                  (no NPU version: DDP + torch_npu_run; manual)
  data-parallel-guard  ``x.type == "cuda"``, ``torch.cuda.is_available()``… in the test of an ``if``
                       (or ``a if test else b``) whose branches use DataParallel: rewriting it would
                       send the script into the DataParallel path, which fails on the NPU (manual)
  nvidia-smi           a command line naming ``nvidia-smi``  (npu-smi / torch.npu queries; manual)

Only rewrites that keep a working script working are ``fixable``; everything with no NPU
equivalent is reported with advice and left as it is.
"""
import dataclasses
import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from . import _npu_names

_DEVICE = re.compile(r"cuda(:(\d+|%d|%s|\{\w*\}))?")
_BACKEND = re.compile(r"((cpu|cuda):\w+,)*(cpu|cuda):nccl(,(cpu|cuda):\w+)*|nccl")
_DEVICE_KWARG_KINDS = {"map_location": "map-location", "pin_memory_device": "pin-memory-device"}
_DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                  "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel",
                  "torch.nn.parallel.data_parallel.data_parallel"}
_DATA_PARALLEL_HINT = ("DataParallel does not run on the NPU: use DistributedDataParallel (backend 'hccl'), "
                       "one process per device, launched by torch_npu_run --nproc-per-node N; manual")
_DP_GUARD_HINT = ("decides whether to take a DataParallel path: rewritten for the NPU it would enter that "
                  "path, which fails there; port the DataParallel branch (DDP + torch_npu_run) first; manual")
_CPP_EXTENSION_LOADERS = {"torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"}
_CUDA_SOURCE = re.compile(r".*\.(cu|cuh)")
_NVIDIA_SMI_HINT = ("npu-smi info on an Ascend host; in Python torch.npu.mem_get_info() / "
                    "torch.npu.utilization(); manual")


@dataclasses.dataclass
class Finding:
    line: int
    column: int
    kind: str
    code: str
    replacement: str
    fixable: bool

    def as_dict(self):
        return dataclasses.asdict(self)


def _code(node):
    text = cst.Module([]).code_for_node(node)
    return text if len(text) <= 80 else text[:77] + "..."


class _CudaRules(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, fix):
        super().__init__()
        self.fix = fix
        self.findings = []
        self._kwarg_stack = []  # keyword names of the arguments we are inside
        self._compare_depth = 0  # inside a comparison (==, !=, in, ...)
        self._dp_guard_depth = 0  # inside the test of an if/elif/ternary whose branches use DataParallel
        self.imports_torch_npu = False
        self._dp_guards = []

    # -- helpers --------------------------------------------------------------------------------

    def _add(self, node, kind, replacement, fixable):
        pos = self.get_metadata(PositionProvider, node).start
        self.findings.append(Finding(pos.line, pos.column + 1, kind, _code(node), replacement, fixable))

    def _qualified(self, node):
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
        if not names:
            dotted = cst.helpers.get_full_name_for_node(node)
            if dotted:
                names = {dotted}
        return names

    def _string_kind(self, default):
        for name in reversed(self._kwarg_stack):
            if name in _DEVICE_KWARG_KINDS:
                return _DEVICE_KWARG_KINDS[name]
        return default

    # -- arguments: remember keyword context ------------------------------------------------------

    def visit_Arg(self, node):
        self._kwarg_stack.append(node.keyword.value if node.keyword else None)

    def leave_Arg(self, original, updated):
        self._kwarg_stack.pop()
        return updated

    # -- tests of branches that use DataParallel ---------------------------------------------------

    def _uses_data_parallel(self, nodes):
        for node in nodes:
            for found in m.findall(node, m.Name("DataParallel") | m.Name("data_parallel")):
                del found
                return True
        return False

    def visit_If_test(self, node):
        if self._uses_data_parallel([node.body] + ([node.orelse] if node.orelse else [])):
            self._dp_guard_depth += 1
            self._dp_guards.append(node)

    def leave_If_test(self, node):
        if self._dp_guards and self._dp_guards[-1] is node:
            self._dp_guards.pop()
            self._dp_guard_depth -= 1

    def visit_IfExp_test(self, node):
        self.visit_If_test(node)

    def leave_IfExp_test(self, node):
        self.leave_If_test(node)

    def visit_Comparison(self, node):
        self._compare_depth += 1

    def leave_Comparison(self, original, updated):
        self._compare_depth -= 1
        return updated

    # -- strings ------------------------------------------------------------------------------

    def leave_SimpleString(self, original, updated):
        try:
            value = original.evaluated_value
        except Exception:
            return updated
        if not isinstance(value, str):
            return updated
        if "nvidia-smi" in value:
            self._add(original, "nvidia-smi", _NVIDIA_SMI_HINT, False)
            return updated
        if _DEVICE.fullmatch(value) and self._compare_depth and self._dp_guard_depth:
            self._add(original, "data-parallel-guard", _DP_GUARD_HINT, False)
            return updated
        if _DEVICE.fullmatch(value):
            new = updated.value.replace("cuda", "npu", 1)
            self._add(original, self._string_kind("device-string"), new, True)
        elif _BACKEND.fullmatch(value):
            new = updated.value.replace("nccl", "hccl").replace("cuda", "npu")
            self._add(original, "nccl", new, True)
        elif value == "CUDA_VISIBLE_DEVICES":
            new = updated.value.replace("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
            self._add(original, "cuda-visible-devices", new, True)
        else:
            return updated
        return updated.with_changes(value=new) if self.fix else updated

    def leave_FormattedString(self, original, updated):
        parts = original.parts
        if not parts or not isinstance(parts[0], cst.FormattedStringText):
            return updated
        head = parts[0].value
        whole_device = head == "cuda:" and len(parts) == 2 and isinstance(parts[1], cst.FormattedStringExpression)
        if not (whole_device or (head.startswith("cuda:") and len(parts) == 1 and _DEVICE.fullmatch(head))):
            return updated
        new_parts = [updated.parts[0].with_changes(value="npu" + head[4:])] + list(updated.parts[1:])
        new_node = updated.with_changes(parts=new_parts)
        self._add(original, self._string_kind("device-string"), _code(new_node), True)
        return new_node if self.fix else updated

    # -- attributes: torch.cuda.X, torch.backends.cudnn.X, x.is_cuda ------------------------------

    def leave_Attribute(self, original, updated):
        attr = original.attr.value
        if attr == "is_cuda" and self._dp_guard_depth:
            self._add(original, "data-parallel-guard", _DP_GUARD_HINT, False)
            return updated
        if attr == "is_cuda":
            self._add(original, "is-cuda", _code(original.value) + ".is_npu", True)
            return updated.with_changes(attr=cst.Name("is_npu")) if self.fix else updated
        for name in self._qualified(original):
            parts = name.split(".")
            if parts[:2] == ["torch", "cuda"] and len(parts) == 3:
                return self._torch_cuda(original, updated, parts[2])
            if parts[:2] == ["torch", "backends"] and len(parts) == 4 and parts[2] in ("cudnn", "cuda"):
                self._add(original, "cudnn-flag", _cudnn_hint(parts[2], parts[3]), False)
                return updated
            if name in _DATA_PARALLEL:
                self._add(original, "data-parallel", _DATA_PARALLEL_HINT, False)
                return updated
            if name == "torch.distributed.is_nccl_available":
                self._add(original, "nccl", "torch_npu.distributed.is_hccl_available", False)
                return updated
            if name.startswith("torch.utils.cpp_extension.") and parts[-1] in ("CUDAExtension", "CUDA_HOME"):
                self._add(original, "cuda-library", _npu_names.CUDA_LIBRARIES[name], False)
                return updated
        return updated

    def _torch_cuda(self, original, updated, name):
        if self._dp_guard_depth:
            self._add(original, "data-parallel-guard", _DP_GUARD_HINT, False)
            return updated
        rewritable = m.matches(original.value, m.Attribute(attr=m.Name("cuda")))
        if name == "amp":
            kind, target, known = "cuda-amp", "amp", True
        elif name in _npu_names.RENAMED:
            kind, target, known = "torch-cuda", _npu_names.RENAMED[name], True
        else:
            kind, target, known = "torch-cuda", name, name in _npu_names.NPU_NAMES
        if not known:
            hint = _npu_names.NO_COUNTERPART.get(name, f"no torch.npu.{name} in torch_npu 2.13.0; manual port")
            self._add(original, kind, hint, False)
            return updated
        fixable = rewritable
        self._add(original, kind, f"torch.npu.{target}", fixable)
        if not (self.fix and fixable):
            return updated
        return updated.with_changes(value=updated.value.with_changes(attr=cst.Name("npu")),
                                    attr=cst.Name(target))

    def visit_Attribute_attr(self, node):
        self._in_attr = getattr(self, "_in_attr", 0) + 1

    def leave_Attribute_attr(self, node):
        self._in_attr -= 1

    def leave_Name(self, original, updated):
        # A bare name imported from torch.nn (``DataParallel(model)``); ``nn.DataParallel`` is
        # judged as an attribute.
        if original.value in ("DataParallel", "data_parallel") and not getattr(self, "_in_attr", 0):
            if self._qualified(original) & _DATA_PARALLEL:
                self._add(original, "data-parallel", _DATA_PARALLEL_HINT, False)
        return updated

    # -- calls: x.cuda(...) -------------------------------------------------------------------

    def leave_Call(self, original, updated):
        func = original.func
        if self._qualified(func) & _CPP_EXTENSION_LOADERS and _builds_cuda_sources(original):
            self._add(original, "cuda-library", _npu_names.CUDA_LIBRARIES["torch.utils.cpp_extension.CUDAExtension"],
                      False)
            return updated
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
            if any(n.startswith("torch.cuda") for n in self._qualified(func)):
                return updated  # torch.cuda(...) is not a tensor method
            self._add(original, "cuda-call", _code(func.value) + ".npu(...)", True)
            if self.fix:
                return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("npu")))
        return updated

    # -- imports ------------------------------------------------------------------------------

    def visit_Import(self, node):
        for alias in node.names:
            dotted = cst.helpers.get_full_name_for_node(alias.name)
            if dotted == "torch_npu" or dotted.startswith("torch_npu."):
                self.imports_torch_npu = True
            hint = _library_hint(dotted, [])
            if hint:
                self._add(node, "cuda-library", hint, False)
        return False  # the dotted names inside are module paths, judged here

    def visit_ImportFrom(self, node):
        return False  # judged as a whole in leave_ImportFrom

    def leave_ImportFrom(self, original, updated):
        if original.module is None:
            return updated
        module = cst.helpers.get_full_name_for_node(original.module)
        if module == "torch_npu" or module.startswith("torch_npu."):
            self.imports_torch_npu = True
        names = [] if isinstance(original.names, cst.ImportStar) else \
            [cst.helpers.get_full_name_for_node(a.name) for a in original.names]
        hint = _library_hint(module, names)
        if hint:
            self._add(original, "cuda-library", hint, False)
            return updated
        if module in ("torch.cuda", "torch.cuda.amp") or module.startswith("torch.cuda."):
            return self._from_torch_cuda(original, updated, module, names)
        if module == "torch.backends" and {"cudnn", "cuda"} & set(names):
            self._add(original, "cudnn-flag", _cudnn_hint("cudnn", ""), False)
        return updated

    def _from_torch_cuda(self, original, updated, module, names):
        sub = module.split(".")[2:]
        kind = "cuda-amp" if (sub[:1] == ["amp"] or "amp" in names) else "torch-cuda"
        checked = sub[:1] if sub else names
        known = all(n in _npu_names.NPU_NAMES for n in checked) and "*" not in names
        target = "torch.npu" + module[len("torch.cuda"):]
        fixed = updated.with_changes(module=cst.parse_expression(target))
        self._add(original, kind, _code(fixed) if known else "manual port", known)
        return fixed if (self.fix and known) else updated


def _builds_cuda_sources(call):
    """Whether a ``cpp_extension.load``/``load_inline`` call compiles CUDA code."""
    for arg in call.args:
        keyword = arg.keyword.value if arg.keyword else None
        if keyword == "cuda_sources" or (keyword == "with_cuda" and m.matches(arg.value, m.Name("True"))):
            return True
        for s in m.findall(arg.value, m.SimpleString()):
            try:
                value = s.evaluated_value
            except Exception:
                continue
            if isinstance(value, str) and _CUDA_SOURCE.fullmatch(value):
                return True
    return False


def _cudnn_hint(backend, flag):
    if backend == "cuda" and flag == "matmul":
        return "torch.npu.matmul.allow_hf32 (HF32, not TF32); manual"
    if flag == "allow_tf32":
        return "torch.npu.conv.allow_hf32 (HF32, not TF32); manual"
    if flag == "deterministic":
        return "no effect on the NPU: use torch.use_deterministic_algorithms(True)"
    return "no effect on the NPU: remove it"


_LIBRARY_ROOTS = {key.split(".")[0] for key in _npu_names.CUDA_LIBRARIES} - {"torch"}


def _library_hint(module, names):
    """What to use instead of an import from a CUDA-only library, or ``None``."""
    if module.split(".")[0] not in _LIBRARY_ROOTS and module != "torch.utils.cpp_extension":
        return None
    hints = []
    for candidate in [f"{module}.{n}" for n in names] or [module]:
        parts = candidate.split(".")
        for i in range(len(parts), 0, -1):
            hint = _npu_names.CUDA_LIBRARIES.get(".".join(parts[:i]))
            if hint:
                if hint not in hints:
                    hints.append(hint)
                break
    return "; ".join(hints) or None


def check(source, fix=False):
    """Findings in ``source`` (and the rewritten source when ``fix``): ``(findings, new_source)``."""
    module = cst.parse_module(source)
    rules = _CudaRules(fix)
    new_module = MetadataWrapper(module).visit(rules)
    findings = sorted(rules.findings, key=lambda f: (f.line, f.column, f.kind))
    new_source = new_module.code
    if fix and new_source != source and not rules.imports_torch_npu:
        new_source = _add_torch_npu_import(new_module).code
    return findings, new_source


def _add_torch_npu_import(module):
    """``import torch_npu`` after the first top-level ``import torch``: the fixed script then
    works with torch's backend autoload switched off too."""
    body = list(module.body)
    for i, stmt in enumerate(body):
        if m.matches(stmt, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"))])])):
            body.insert(i + 1, cst.parse_statement("import torch_npu\n"))
            return module.with_changes(body=body)
    return module
