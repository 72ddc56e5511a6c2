"""``NpuGraphOpHandler`` and its registry: which ops of a graph can be updated after capture.

With ``torch.npu.graph(g, auto_dispatch_capture=True)``, an op whose name has a
registered handler is captured as its own task group and remembered as a
dispatch record (the callable, its args and kwargs). ``g.update(cpu_update_input)``
then assigns new keyword values to each record (and lets the handler's
``update_args`` change positional ones); the next ``g.replay()`` runs the op
with them, writing into the memory it wrote at capture. Handlers are classes
used through classmethods only: the registry stores the class itself.
"""
import logging

__all__ = ["NpuGraphOpHandler", "register_npu_graph_handler"]

logger = logging.getLogger(__name__)

# op name (``func.__name__``: "my_op", "my_op.default", "my_op.out") -> handler class
_NPU_GRAPH_OP_HANDLERS = {}


class NpuGraphOpHandler:
    """Base class of NPU graph op handlers; override the classmethod hooks you need."""

    # Optional per-op description of updatable arguments, read by get_update_specs.
    _OP_ARG_SPECS = {}

    @classmethod
    def get_update_specs(cls, op_name):
        """The updatable-argument description of ``op_name`` (``None`` when the handler declares none)."""
        return cls._OP_ARG_SPECS.get(op_name)

    @classmethod
    def prepare_capture(cls, func, args, kwargs):
        """Before the op is recorded: returns ``(actual_func, args, kwargs)`` to run and record."""
        return func, args, kwargs

    @classmethod
    def postprocess_result(cls, result, kwargs):
        """After recording: what the caller receives."""
        return result

    @classmethod
    def update_args(cls, dispatch_record, update_input):
        """On ``NPUGraph.update``: change ``dispatch_record.args[i]`` from ``update_input`` (kwargs are done already)."""

    @classmethod
    def record_wrap_kwarg(cls, key, value, tensor_param_names):
        """How a kwarg is stored in the record. Hardware keeps weak references to npu tensors (the graph owns
        their memory); the emulated graph holds its tensors itself, so values are stored as given."""
        if isinstance(value, list):
            return list(value)
        return value


def register_npu_graph_handler(op_names):
    """Class decorator: register the handler class for one op name or a list of names."""
    def decorator(cls):
        names = op_names if isinstance(op_names, (list, tuple)) else [op_names]
        for name in names:
            if name in _NPU_GRAPH_OP_HANDLERS:
                logger.warning("NpuGraphOpHandler for '%s' is being overridden: %s -> %s",
                               name, _NPU_GRAPH_OP_HANDLERS[name].__name__, cls.__name__)
            _NPU_GRAPH_OP_HANDLERS[name] = cls
        return cls
    return decorator


def find_handler(func):
    """The handler registered for an op overload (by full name, then by packet name), or None."""
    name = getattr(func, "__name__", None)
    handler = _NPU_GRAPH_OP_HANDLERS.get(name)
    if handler is None and name and "." in name:
        handler = _NPU_GRAPH_OP_HANDLERS.get(name.split(".")[0])
    return handler
