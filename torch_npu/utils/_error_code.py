"""torch_npu's error suffix: ``\\n[ERROR] <time> (PID:…, Device:…, RankID:…) ERR<sub><code> <SUB> <text>``."""
from enum import Enum

__all__ = []


class _SubModuleID(Enum):
    PTA = 0
    OPS = 1
    DIST = 2
    GRAPH = 3
    PROF = 4
    UNKNOWN = 99


class ErrCode(Enum):
    SUC = (0, "success")
    PARAM = (1, "invalid parameter")
    TYPE = (2, "invalid type")
    VALUE = (3, "invalid value")
    PTR = (4, "invalid pointer")
    INTERNAL = (5, "internal error")
    MEMORY = (6, "memory error")
    NOT_SUPPORT = (7, "feature not supported")
    NOT_FOUND = (8, "resource not found")
    UNAVAIL = (9, "resource unavailable")
    SYSCALL = (10, "system call failed")
    TIMEOUT = (11, "timeout error")
    PERMISSION = (12, "permission error")
    ACL = (100, "call acl api failed")
    HCCL = (200, "call hccl api failed")
    GE = (300, "call ge api failed")
    EXCEPTION = (999, "applicaiton exception")

    @property
    def code(self):
        return self.value[0]

    @property
    def msg(self):
        return self.value[1]


def _format_error_msg(submodule, error_code):
    """The suffix, formatted by the C++ core's one formatter (``NPUException.cpp``):
    same rules for Python and C++ errors (compact output, device, rank)."""
    from torch_npu import _C
    return _C._format_error_code(submodule.value, error_code.code)


def pta_error(error_code: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.PTA, error_code)


def ops_error(error_code: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.OPS, error_code)


def dist_error(error_code: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.DIST, error_code)


def graph_error(error_code: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.GRAPH, error_code)


def prof_error(error_code: ErrCode) -> str:
    return _format_error_msg(_SubModuleID.PROF, error_code)
