"""torchair's CompilerConfig: the option tree users set, validated by name.

On hardware these options steer GE graph compilation and aclgraph capture.
The emulated device compiles with Inductor's CPU code generation whatever
they say: every option is accepted, validated against its allowed values,
recorded, and otherwise ignored (docs/graph_mode.md says why).
"""


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


class CompilerConfig(_Group):
    """``torchair.CompilerConfig()``: ``config.mode = "reduce-overhead"`` and friends."""

    def __init__(self):
        super().__init__(
            mode=_Option("max-autotune", ("max-autotune", "reduce-overhead")),
            debug=_Group(
                graph_dump=_Group(type=_Option(None, (None, "txt", "pbtxt", "py")),
                                  path=_Option("./")),
                fx_summary=_Group(type=_Option(None, (None, "csv"))),
                data_dump=_Group(type=_Option(None, (None, "npy"))),
                aclgraph=_Group(disable_reinplace_inplaceable_ops_pass=_Option(False, _ON_OFF),
                                disable_reinplace_input_mutated_ops_pass=_Option(False, _ON_OFF),
                                enable_output_clone=_Option(False, _ON_OFF)),
            ),
            export=_Group(experimental=_Group(enable_lite_export=_Option(False, _ON_OFF),
                                              auto_atc_config_generated=_Option(False, _ON_OFF))),
            dump_config=_Group(enable_dump=_Option(False, _ON_OFF), dump_path=_Option("./"),
                               dump_mode=_Option("all", ("input", "output", "all"))),
            fusion_config=_Group(fusion_switch_file=_Option(None)),
            experimental_config=_Group(
                cc_parallel_enable=_Option(False, _ON_OFF),
                keep_inference_input_mutations=_Option(True, _ON_OFF),
                memory_efficiency=_Option(False, _ON_OFF),
                separate_atomic_clean=_Option(True, _ON_OFF),
                frozen_parameter=_Option(False, _ON_OFF),
                static_model_ops_lower_limit=_Option(None),
                jit_compile=_Option("auto", ("auto", True, False)),
                npu_fx_pass=_Option(False, _ON_OFF),
                topology_sorting_strategy=_Option("DFS", ("BFS", "DFS", "RDFS", "StableRDFS")),
                enable_single_stream=_Option(False, _ON_OFF),
                remove_noop_ops=_Option(True, _ON_OFF),
                aclgraph=_Group(disable_reinplace_inplaceable_ops_pass=_Option(False, _ON_OFF)),
            ),
            inference_config=_Group(dynamic_gears_merge_policy=_Option("zip", ("zip", "product"))),
            ge_config=_Group(enable_single_stream=_Option(False, _ON_OFF),
                             oo_level=_Option("O3", ("O1", "O3")),
                             export_compile_stat=_Option("1", ("0", "1", "2"))),
            aoe_config=_Group(aoe_mode=_Option(None, (None, "1", "2")), work_path=_Option("./"),
                              aoe_config_file=_Option(None)),
        )
