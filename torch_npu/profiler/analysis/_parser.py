"""From one ``*_ascend_pt`` directory's raw data to ASCEND_PROFILER_OUTPUT/,
the TensorBoard trace and the summary."""
import glob
import os

from . import _csv_views, _summary, _trace_views
from ._profile_data import ProfileData

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"


def parse_one(prof_dir: str) -> str:
    data = ProfileData(prof_dir)
    out = os.path.join(prof_dir, OUTPUT_DIR)
    os.makedirs(out, exist_ok=True)
    aic_none = data.experimental_config.get("_aic_metrics") == "ACL_AICORE_NONE"
    _trace_views.write_trace_view(data, out)
    _csv_views.write_kernel_details(data, out, all_headers=not aic_none)
    _csv_views.write_operator_details(data, out)
    _csv_views.write_op_statistic(data, out)
    _csv_views.write_step_trace_time(data, out)
    if data.config.get("common_config", {}).get("profile_memory"):
        _csv_views.write_memory_views(data, out)
    worker = os.path.basename(prof_dir)[:-len("_ascend_pt")]
    _trace_views.write_tb_trace(data, os.path.join(prof_dir, f"{worker}.pt.trace.json"))
    _summary.write(data, out)
    return out


def profiler_dirs(path: str) -> list:
    """``path`` itself when it is an ``*_ascend_pt`` directory, else those under it."""
    path = os.path.abspath(path)
    if path.endswith("_ascend_pt"):
        return [path]
    return sorted(d for d in glob.glob(os.path.join(path, "*_ascend_pt")) if os.path.isdir(d))
