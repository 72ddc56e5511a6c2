"""Patch a module of PyTorch when it is first imported, not before.

Some patches target heavy modules (FSDP takes seconds to import): importing
them eagerly would make every ``import torch`` pay for it. ``after_import``
runs the patch at once if the module is loaded, else right after its import.
"""
import importlib.abc
import sys
import threading

__all__ = []

_lock = threading.Lock()
_pending = {}  # module name -> [callbacks]


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Wraps the real loader of a pending module so the callbacks run after it executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            with _lock:
                callbacks = _pending.pop(fullname, [])
            for fn in callbacks:
                fn(module)

        spec.loader.exec_module = exec_then_patch
        return spec


_finder = _AfterImportFinder()


def after_import(module_name: str, fn) -> None:
    """Call ``fn(module)`` now if ``module_name`` is imported, else once it is."""
    module = sys.modules.get(module_name)
    if module is not None:
        fn(module)
        return
    with _lock:
        _pending.setdefault(module_name, []).append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
