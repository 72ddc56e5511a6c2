"""Finding (and, where safe, fixing) CUDA-only constructs in one Python module.

One pass over the module's syntax tree (the standard library's ``ast``, so no third-party
parser and a few milliseconds a file): names are resolved through the file's imports
(``import torch as th; th.cuda.X`` is ``torch.cuda.X``), strings are judged by their value.
A fix is a splice of the source text at the node's exact position, checked against the text it
replaces, so comments and formatting are untouched. Every finding says what it is, where, and
what to use on the NPU; ``fixable`` ones are rewritten by ``check(source, fix=True)``.

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
import ast
import dataclasses
import io
import re
import tokenize

from . import _npu_names

_DEVICE = re.compile(r"cuda(:(\d+|%d|%s|\{\w*\}))?")
_BACKEND = re.compile(r"((cpu|cuda):\w+,)*(cpu|cuda):nccl(,(cpu|cuda):\w+)*|nccl")
# A string constant can only match a string rule when its value contains one of these.
_STRING_WORDS = ("cuda", "nccl", "CUDA_VISIBLE_DEVICES", "nvidia-smi")
_DEVICE_KWARG_KINDS = {"map_location": "map-location", "pin_memory_device": "pin-memory-device"}
_DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                  "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel",
                  "torch.nn.parallel.data_parallel.data_parallel"}
_DATA_PARALLEL_NAMES = ("DataParallel", "data_parallel")
_DATA_PARALLEL_HINT = ("DataParallel does not run on the NPU: use DistributedDataParallel (backend 'hccl'), "
                       "one process per device, launched by torch_npu_run --nproc-per-node N; manual")
_DP_GUARD_HINT = ("decides whether to take a DataParallel path: rewritten for the NPU it would enter that "
                  "path, which fails there; port the DataParallel branch (DDP + torch_npu_run) first; manual")
_CPP_EXTENSION_LOADERS = {"torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"}
_CUDA_SOURCE = re.compile(r".*\.(cu|cuh)")
_NVIDIA_SMI_HINT = ("npu-smi info on an Ascend host; in Python torch.npu.mem_get_info() / "
                    "torch.npu.utilization(); manual")
_FSTRING_HEAD = re.compile(r"([A-Za-z]*)('''|\"\"\"|'|\")cuda")
_FROM_MODULE = re.compile(r"from[ \t\\\r\n]+([A-Za-z_][\w \t.]*?)[ \t\\\r\n]+import\b")
_NEWLINE = re.compile(r"\r\n|\r|\n")


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


def _short(text):
    return text if len(text) <= 80 else text[:77] + "..."


class _Text:
    """The source with ``ast`` positions (1-based lines, UTF-8 byte columns) turned into offsets."""

    def __init__(self, source, base):
        self.source = source
        self.base = base  # a leading BOM is not part of what ast saw
        body = source[base:]
        self.starts = [base] + [base + mo.end() for mo in _NEWLINE.finditer(body)]

    def offset(self, line, byte_col):
        start = self.starts[line - 1]
        end = self.starts[line] if line < len(self.starts) else len(self.source)
        text = self.source[start:end]
        if text.isascii():
            return start + byte_col
        return start + len(text.encode("utf-8")[:byte_col].decode("utf-8", "ignore"))

    def start(self, node):
        return self.offset(node.lineno, node.col_offset)

    def end(self, node):
        return self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node):
        return self.source[self.start(node):self.end(node)]

    def column(self, offset):
        """1-based (line, column) of a source offset."""
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self.starts[lo] + 1


def _dotted(node):
    """The name a node spells as written (``a.b.c``; a call or subscript spells its callee's)."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return ".".join(reversed(parts))
        else:
            return None


def _import_bindings(tree):
    """Every name an import binds anywhere in the module -> the qualified names it may stand for."""
    bindings = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bindings.setdefault(alias.asname, set()).add(alias.name)
                else:
                    head = alias.name.split(".")[0]
                    bindings.setdefault(head, set()).add(head)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    bindings.setdefault(alias.asname or alias.name, set()).add(f"{node.module}.{alias.name}")
    return bindings


def _mentions_data_parallel(nodes):
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.keyword):
                name = node.arg
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.arg):
                name = node.arg
            elif isinstance(node, ast.alias):
                if any(p in _DATA_PARALLEL_NAMES for p in node.name.split(".")) or node.asname in _DATA_PARALLEL_NAMES:
                    return True
                continue
            else:
                continue
            if name in _DATA_PARALLEL_NAMES:
                return True
    return False


def _string_tokens(text):
    """``(offset, token)`` of each string literal in ``text`` (one, or several implicitly joined)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO("(" + text + ")").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    starts = [0] + [mo.end() for mo in _NEWLINE.finditer("(" + text + ")")]
    return [(starts[t.start[0] - 1] + t.start[1] - 1, t.string) for t in tokens if t.type == tokenize.STRING]


class _CudaRules:
    """Walks the tree once, keeping the context the rules depend on."""

    def __init__(self, text, tree, fix):
        self.text = text
        self.fix = fix
        self.findings = []
        self.edits = []  # (start, end, expected old text, new text)
        self.bindings = _import_bindings(tree)
        self._kwarg_stack = []  # keyword names of the call arguments we are inside
        self._compare_depth = 0  # inside a comparison (==, !=, in, ...)
        self._dp_guard_depth = 0  # inside the test of an if/elif/ternary whose branches use DataParallel
        self.imports_torch_npu = False

    # -- helpers --------------------------------------------------------------------------------

    def _add_at(self, offset, kind, code, replacement, fixable):
        line, column = self.text.column(offset)
        self.findings.append(Finding(line, column, kind, _short(code), replacement, fixable))

    def _add(self, node, kind, replacement, fixable):
        self._add_at(self.text.start(node), kind, self.text.segment(node), replacement, fixable)

    def _edit(self, start, end, old, new):
        if self.fix:
            self.edits.append((start, end, old, new))

    def _edit_attr(self, node, new):
        """Replace the attribute name that ends ``node`` (``x.<attr>``)."""
        end = self.text.end(node)
        self._edit(end - len(node.attr), end, node.attr, new)

    def _qualified(self, node):
        """The qualified names ``node`` may stand for: its head resolved through the imports."""
        dotted = _dotted(node)
        if not dotted:
            return set()
        head, dot, rest = dotted.partition(".")
        if head in self.bindings:
            return {q + dot + rest for q in self.bindings[head]}
        return {dotted}

    def _string_kind(self, default):
        for name in reversed(self._kwarg_stack):
            if name in _DEVICE_KWARG_KINDS:
                return _DEVICE_KWARG_KINDS[name]
        return default

    # -- the walk -------------------------------------------------------------------------------

    def visit(self, node):
        method = getattr(self, "visit_" + node.__class__.__name__, None)
        if method is not None:
            method(node)
        else:
            self.generic_visit(node)

    def generic_visit(self, node):
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def _visit_guarded_test(self, test, branches):
        guard = _mentions_data_parallel(branches)
        self._dp_guard_depth += guard
        self.visit(test)
        self._dp_guard_depth -= guard

    def visit_If(self, node):
        self._visit_guarded_test(node.test, node.body + node.orelse)
        for child in node.body + node.orelse:
            self.visit(child)

    def visit_IfExp(self, node):
        self.visit(node.body)
        self._visit_guarded_test(node.test, [node.body, node.orelse])
        self.visit(node.orelse)

    def visit_Compare(self, node):
        self._compare_depth += 1
        self.generic_visit(node)
        self._compare_depth -= 1

    def visit_Call(self, node):
        self.visit(node.func)
        for arg in node.args:
            self._kwarg_stack.append(None)
            self.visit(arg)
            self._kwarg_stack.pop()
        for kw in node.keywords:
            self._kwarg_stack.append(kw.arg)
            self.visit(kw.value)
            self._kwarg_stack.pop()
        self._leave_call(node)

    def visit_Attribute(self, node):
        self.visit(node.value)
        self._leave_attribute(node)

    def visit_Name(self, node):
        # A bare name imported from torch.nn (``DataParallel(model)``); ``nn.DataParallel`` is
        # judged as an attribute.
        if node.id in _DATA_PARALLEL_NAMES and self._qualified(node) & _DATA_PARALLEL:
            self._add(node, "data-parallel", _DATA_PARALLEL_HINT, False)

    # -- strings ------------------------------------------------------------------------------

    def visit_Constant(self, node):
        if isinstance(node.value, str) and any(w in node.value for w in _STRING_WORDS):
            self._strings(node)

    def visit_JoinedStr(self, node):
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                self.visit(value)
        if any(isinstance(v, ast.Constant) and any(w in v.value for w in _STRING_WORDS) for v in node.values):
            self._strings(node)

    def _strings(self, node):
        start = self.text.start(node)
        for offset, token in _string_tokens(self.text.segment(node)):
            try:
                literal = ast.parse(token, mode="eval").body
            except (SyntaxError, ValueError):
                continue
            if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                self._simple_string(start + offset, token, literal.value)
            elif isinstance(literal, ast.JoinedStr):
                self._formatted_string(start + offset, token, literal)

    def _simple_string(self, offset, raw, value):
        if "nvidia-smi" in value:
            self._add_at(offset, "nvidia-smi", raw, _NVIDIA_SMI_HINT, False)
            return
        if _DEVICE.fullmatch(value) and self._compare_depth and self._dp_guard_depth:
            self._add_at(offset, "data-parallel-guard", raw, _DP_GUARD_HINT, False)
            return
        if _DEVICE.fullmatch(value):
            new, kind = raw.replace("cuda", "npu", 1), self._string_kind("device-string")
        elif _BACKEND.fullmatch(value):
            new, kind = raw.replace("nccl", "hccl").replace("cuda", "npu"), "nccl"
        elif value == "CUDA_VISIBLE_DEVICES":
            new, kind = raw.replace("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"), "cuda-visible-devices"
        else:
            return
        self._add_at(offset, kind, raw, new, True)
        self._edit(offset, offset + len(raw), raw, new)

    def _formatted_string(self, offset, raw, literal):
        parts = literal.values
        if not parts or not isinstance(parts[0], ast.Constant):
            return
        head = parts[0].value
        whole_device = head == "cuda:" and len(parts) == 2 and isinstance(parts[1], ast.FormattedValue)
        if not (whole_device or (head.startswith("cuda:") and len(parts) == 1 and _DEVICE.fullmatch(head))):
            return
        match = _FSTRING_HEAD.match(raw)
        if match is None:
            return
        new = raw[:match.end() - 4] + "npu" + raw[match.end():]
        # the fixes already made inside its replacement fields are part of the rewritten string
        inner = [(a - offset, b - offset, old, text) for a, b, old, text in self.edits
                 if offset <= a and b <= offset + len(raw)]
        self.edits = [e for e in self.edits if not (offset <= e[0] and e[1] <= offset + len(raw))]
        new = _apply(new, [(a - 1, b - 1, old, text) if a >= match.end() else (a, b, old, text)
                           for a, b, old, text in inner])
        self._add_at(offset, self._string_kind("device-string"), raw, _short(new), True)
        self._edit(offset, offset + len(raw), raw, new)

    # -- attributes: torch.cuda.X, torch.backends.cudnn.X, x.is_cuda ------------------------------

    def _leave_attribute(self, node):
        attr = node.attr
        if attr == "is_cuda" and self._dp_guard_depth:
            self._add(node, "data-parallel-guard", _DP_GUARD_HINT, False)
            return
        if attr == "is_cuda":
            self._add(node, "is-cuda", self.text.segment(node.value) + ".is_npu", True)
            self._edit_attr(node, "is_npu")
            return
        for name in self._qualified(node):
            parts = name.split(".")
            if parts[:2] == ["torch", "cuda"] and len(parts) == 3:
                return self._torch_cuda(node, parts[2])
            if parts[:2] == ["torch", "backends"] and len(parts) == 4 and parts[2] in ("cudnn", "cuda"):
                return self._add(node, "cudnn-flag", _cudnn_hint(parts[2], parts[3]), False)
            if name in _DATA_PARALLEL:
                return self._add(node, "data-parallel", _DATA_PARALLEL_HINT, False)
            if name == "torch.distributed.is_nccl_available":
                return self._add(node, "nccl", "torch_npu.distributed.is_hccl_available", False)
            if name.startswith("torch.utils.cpp_extension.") and parts[-1] in ("CUDAExtension", "CUDA_HOME"):
                return self._add(node, "cuda-library", _npu_names.CUDA_LIBRARIES[name], False)

    def _torch_cuda(self, node, name):
        if self._dp_guard_depth:
            return self._add(node, "data-parallel-guard", _DP_GUARD_HINT, False)
        rewritable = isinstance(node.value, ast.Attribute) and node.value.attr == "cuda"
        if name == "amp":
            kind, target, known = "cuda-amp", "amp", True
        elif name in _npu_names.RENAMED:
            kind, target, known = "torch-cuda", _npu_names.RENAMED[name], True
        else:
            kind, target, known = "torch-cuda", name, name in _npu_names.NPU_NAMES
        if not known:
            hint = _npu_names.NO_COUNTERPART.get(name, f"no torch.npu.{name} in torch_npu 2.13.0; manual port")
            return self._add(node, kind, hint, False)
        self._add(node, kind, f"torch.npu.{target}", rewritable)
        if rewritable:
            self._edit_attr(node.value, "npu")
            if target != name:
                self._edit_attr(node, target)

    # -- calls: x.cuda(...), cpp_extension.load(...) --------------------------------------------

    def _leave_call(self, node):
        func = node.func
        if self._qualified(func) & _CPP_EXTENSION_LOADERS and _builds_cuda_sources(node):
            self._add(node, "cuda-library", _npu_names.CUDA_LIBRARIES["torch.utils.cpp_extension.CUDAExtension"],
                      False)
            return
        if isinstance(func, ast.Attribute) and func.attr == "cuda":
            if any(n.startswith("torch.cuda") for n in self._qualified(func)):
                return  # torch.cuda(...) is not a tensor method
            self._add(node, "cuda-call", self.text.segment(func.value) + ".npu(...)", True)
            self._edit_attr(func, "npu")

    # -- imports ------------------------------------------------------------------------------

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name == "torch_npu" or alias.name.startswith("torch_npu."):
                self.imports_torch_npu = True
            hint = _library_hint(alias.name, [])
            if hint:
                self._add(node, "cuda-library", hint, False)

    def visit_ImportFrom(self, node):
        if node.module is None or node.level:
            return
        module = node.module
        if module == "torch_npu" or module.startswith("torch_npu."):
            self.imports_torch_npu = True
        names = [a.name for a in node.names if a.name != "*"]
        hint = _library_hint(module, names)
        if hint:
            return self._add(node, "cuda-library", hint, False)
        if module in ("torch.cuda", "torch.cuda.amp") or module.startswith("torch.cuda."):
            return self._from_torch_cuda(node, module, names)
        if module == "torch.backends" and {"cudnn", "cuda"} & set(names):
            self._add(node, "cudnn-flag", _cudnn_hint("cudnn", ""), False)

    def _from_torch_cuda(self, node, module, names):
        sub = module.split(".")[2:]
        kind = "cuda-amp" if (sub[:1] == ["amp"] or "amp" in names) else "torch-cuda"
        checked = sub[:1] if sub else names
        known = all(n in _npu_names.NPU_NAMES for n in checked)
        target = "torch.npu" + module[len("torch.cuda"):]
        code = self.text.segment(node)
        match = _FROM_MODULE.match(code)
        if known and match is not None and re.sub(r"\s", "", match.group(1)) == module:
            start = self.text.start(node) + match.start(1)
            fixed = code[:match.start(1)] + target + code[match.end(1):]
            self._add(node, kind, _short(fixed), True)
            self._edit(start, start + len(match.group(1)), match.group(1), target)
        else:
            self._add(node, kind, "manual port", False)


def _builds_cuda_sources(call):
    """Whether a ``cpp_extension.load``/``load_inline`` call compiles CUDA code."""
    for keyword, value in [(None, a) for a in call.args] + [(k.arg, k.value) for k in call.keywords]:
        if keyword == "cuda_sources" or (keyword == "with_cuda" and isinstance(value, ast.Constant)
                                         and value.value is True):
            return True
        for s in ast.walk(value):
            if isinstance(s, ast.Constant) and isinstance(s.value, str) and _CUDA_SOURCE.fullmatch(s.value):
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
    """Findings in ``source`` (and the rewritten source when ``fix``): ``(findings, new_source)``.

    Raises ``SyntaxError`` (or ``ValueError`` for a NUL byte) when ``source`` is not Python."""
    base = 1 if source.startswith("\ufeff") else 0
    tree = ast.parse(source[base:])
    text = _Text(source, base)
    rules = _CudaRules(text, tree, fix)
    rules.visit(tree)
    findings = sorted(rules.findings, key=lambda f: (f.line, f.column, f.kind))
    new_source = _apply(source, rules.edits)
    if fix and new_source != source and not rules.imports_torch_npu:
        new_source = _add_torch_npu_import(new_source, tree, _Text(new_source, base))
    return findings, new_source


def _apply(source, edits):
    """The source with each edit spliced in; an edit whose text is not what it expects is dropped."""
    out, last = [], len(source)
    for start, end, old, new in sorted(set(edits), reverse=True):
        if end > last or source[start:end] != old:
            continue  # overlaps a later edit, or the position does not hold what the node said
        out.append(source[end:last])
        out.append(new)
        last = start
    out.append(source[:last])
    return "".join(reversed(out))


def _add_torch_npu_import(source, tree, text):
    """``import torch_npu`` after the first top-level ``import torch`` line: the fixed script then
    works with torch's backend autoload switched off too."""
    body = tree.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.Import) and len(stmt.names) == 1 and stmt.names[0].name == "torch"):
            continue
        if (i and body[i - 1].end_lineno == stmt.lineno) or (i + 1 < len(body) and body[i + 1].lineno
                                                               == stmt.end_lineno):
            continue  # shares its line with another statement
        line = stmt.end_lineno
        if line < len(text.starts):
            at = text.starts[line]
            newline = _NEWLINE.search(source, text.starts[line - 1]).group()
            return source[:at] + "import torch_npu" + newline + source[at:]
        return source + ("" if source.endswith(("\n", "\r")) else "\n") + "import torch_npu\n"
    return source
