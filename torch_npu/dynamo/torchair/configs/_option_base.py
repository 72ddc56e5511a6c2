"""The building blocks of torchair's CompilerConfig option tree.

On hardware these options steer GE graph compilation and aclgraph capture.
The emulated device compiles with Inductor's CPU code generation whatever
they say: every option is accepted, validated against its allowed values,
recorded, and otherwise ignored (docs/graph_mode.md says why).
"""

__all__ = []


class _Option:
    def __init__(self, default, allowed=None):
        self.value = default
        self.allowed = allowed

    def set(self, name, value):
        if self.allowed is not None and value not in self.allowed:
            raise ValueError(f"'{value}' not in optional list {list(self.allowed)} for option {name}")
        self.value = value


class _Group:
    """A node of the option tree: attributes are options or sub-groups."""

    def __init__(self, **options):
        object.__setattr__(self, "_options", options)

    def __getattr__(self, name):
        options = object.__getattribute__(self, "_options")
        if name not in options:
            raise AttributeError(f"{type(self).__name__} has no option '{name}'")
        item = options[name]
        return item.value if isinstance(item, _Option) else item

    def __setattr__(self, name, value):
        options = object.__getattribute__(self, "_options")
        if name not in options or not isinstance(options[name], _Option):
            raise AttributeError(f"'{name}' is not a settable option of {type(self).__name__}")
        options[name].set(name, value)

    def as_dict(self):
        out = {}
        for k, v in object.__getattribute__(self, "_options").items():
            out[k] = v.as_dict() if isinstance(v, _Group) else v.value
        return out


_ON_OFF = (True, False)
