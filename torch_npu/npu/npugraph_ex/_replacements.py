"""User pattern replacements of the npugraph_ex backend, kept in one Inductor pattern pass."""
import hashlib
from typing import Any, Callable, Dict, Iterable, Optional, Union

__all__ = ["register_replacement"]

_state = {"pass": None, "count": 0}


def _pattern_pass():
    if _state["pass"] is None:
        from torch._inductor.pattern_matcher import PatternMatcherPass
        _state["pass"] = PatternMatcherPass(pass_name="npugraph_ex_user_patterns")
    return _state["pass"]


def register_replacement(search_fn, replace_fn, example_inputs: Iterable[Any], trace_fn=None, extra_check=None,
                         search_fn_pattern=None, scalar_workaround: Optional[Dict[str, Union[float, int]]] = None,
                         skip_duplicates: bool = False):
    """Replace every match of ``search_fn`` by ``replace_fn`` in graphs compiled by npugraph_ex.

    Arguments are those of ``torch._inductor.pattern_matcher.register_replacement``
    (``trace_fn`` defaults to ``fwd_only``, ``extra_check`` to always true).
    """
    from torch._inductor import pattern_matcher as pm
    registered = pm.register_replacement(
        search_fn, replace_fn, list(example_inputs), trace_fn if trace_fn is not None else pm.fwd_only,
        _pattern_pass(), extra_check=extra_check if extra_check is not None else pm._return_true,
        search_fn_pattern=search_fn_pattern, scalar_workaround=scalar_workaround or {},
        skip_duplicates=skip_duplicates)
    _state["count"] += 1
    return registered


def post_grad_pass():
    """The Inductor custom pass applying the registered replacements (None when there are none)."""
    if _state["pass"] is None:
        return None
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class _UserPatterns(CustomGraphPass):
        def __call__(self, graph):
            _state["pass"].apply(graph)

        def uuid(self):
            # Changes when patterns are added, so the FX graph cache does not serve graphs compiled without them.
            return hashlib.sha256(f"npugraph_ex-patterns-{_state['count']}".encode()).hexdigest()

    return _UserPatterns()
