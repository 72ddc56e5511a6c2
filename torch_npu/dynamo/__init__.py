"""torch_npu.dynamo: graph mode glue.

At ``import torch_npu`` this only (1) makes ``import torchair`` and
``import npugraph_ex`` resolve to the bundled modules, (2) routes
``torch.compile``'s default Inductor backend to the npu path, and (3) arranges
for the dynamo registrations (npu device interface, trace rules, backends
``npu``/``npugraph_ex``/``npugraphs``) to run when ``torch._dynamo`` is
imported, so plain ``import torch_npu`` does not pay dynamo's import time.
"""
import importlib.abc
import importlib.util
import sys

__all__ = []

_registered = False


def _register_with_dynamo() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from torch_npu.dynamo import backends, device_interface, fake_sdp_choice  # noqa: F401
        device_interface.register()
        backends.register()
    except Exception as e:  # never break `import torch._dynamo`
        import warnings
        warnings.warn(f"torch_npu: registering the npu device with dynamo failed: {e!r}")


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs a callback right after one module has been executed."""

    def __init__(self, fullname, callback):
        self.fullname = fullname
        self.callback = callback
        self._loader = None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                self._loader = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path.remove(self)
        self.callback()


class _PackageAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``alias.sub.mod`` import as ``target.sub.mod``, the same module
    object (a second copy would hold second copies of every class:
    ``torchair.configs.compiler_config.CompilerConfig`` must be
    ``torchair.CompilerConfig``)."""

    def __init__(self, alias, target):
        self.alias = alias
        self.target = target
        self._specs = {}

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(self.alias + "."):
            return None
        real_name = self.target + fullname[len(self.alias):]
        if importlib.util.find_spec(real_name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(self.target + spec.name[len(self.alias):])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # The import system gave the module the alias spec; it keeps its own.
        module.__spec__ = self._specs.pop(module.__spec__.name)


def _install() -> None:
    from torch_npu.dynamo import torchair
    from torch_npu.dynamo import npugraph_ex
    if sys.modules.setdefault("torchair", torchair) is torchair:
        sys.meta_path.insert(0, _PackageAlias("torchair", "torch_npu.dynamo.torchair"))
    sys.modules.setdefault("npugraph_ex", npugraph_ex)

    from torch_npu._inductor import _install_default_inductor_route
    _install_default_inductor_route()

    if "torch._dynamo" in sys.modules:
        _register_with_dynamo()
    else:
        sys.meta_path.insert(0, _AfterImport("torch._dynamo", _register_with_dynamo))
