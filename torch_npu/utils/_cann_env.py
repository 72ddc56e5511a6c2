"""The emulated CANN toolkit on disk, and the environment CANN's ``set_env.sh`` exports.

On an Ascend server, ``source /usr/local/Ascend/ascend-toolkit/set_env.sh``
exports ``ASCEND_TOOLKIT_HOME``, ``ASCEND_HOME_PATH``, ``ASCEND_OPP_PATH``,
``ASCEND_AICPU_PATH`` and ``TOOLCHAIN_HOME``, all pointing into
``ascend-toolkit/latest``. Client libraries read them: DeepSpeed's NPU op
builders and ``ds_report`` index ``os.environ["ASCEND_HOME_PATH"]`` and walk it
for ``ascend_*_install.info``; the real torch_npu checks that ``runtime/``,
``compiler/`` and ``$ASCEND_OPP_PATH`` exist; version probes read
``version.cfg`` and ``compiler/version.info``.

Here the toolkit is a small directory with those version files (all saying
``torch_npu.version.cann``) and empty ``opp/``, ``lib64/``, ``include/``,
``runtime/``, ``compiler/``, ``toolkit/``: no binaries or libraries, since
nothing runs on a real NPU. It lives under the user's cache
(``$XDG_CACHE_HOME`` or ``~/.cache``, then ``torch_npu/``; the temporary
directory if that is not writable), in a directory named after the CANN version
and the layout revision, so installations of different versions never share
one. It is created on first use, atomically (built aside, then renamed), so
concurrent ranks agree on it.

:func:`apply_to_process_env` is what ``import torch_npu`` calls: it exports the
variables for the process and its children when the user has set none of them,
unless ``TORCH_NPU_EMU_CANN_ENV=0``.
"""
import os
import platform
import shlex
import shutil
import tempfile
import warnings

from torch_npu import _settings, version as _version

__all__ = []

SWITCH = "TORCH_NPU_EMU_CANN_ENV"
# The variables, in the order set_env.sh exports them (PATH, LD_LIBRARY_PATH and
# PYTHONPATH are left alone: the emulated toolkit has no binaries, libraries or modules).
VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_AICPU_PATH", "ASCEND_OPP_PATH", "TOOLCHAIN_HOME")
# Either of these set by the user means a CANN environment of their own: nothing is added to it.
_ROOTS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
# Bumped whenever the files laid out below change, so an old cache is not reused.
_LAYOUT = 1
_EMPTY_DIRS = ("opp", "lib64", "include", "runtime", "compiler", "toolkit", "bin")
# The CANN packages that version.cfg lists.
_PACKAGES = ("runtime", "compiler", "hccl", "opp", "toolkit", "aoe", "ncs", "opp_kernel")

SET_AT_IMPORT = "set by torch_npu at import"
INHERITED_EMULATED = "inherited, the emulated toolkit"
USER = "set by the user"

# Variables this process's import of torch_npu exported (name -> value).
_exported = {}


def _arch_dir():
    return f"{platform.machine() or 'x86_64'}-linux"


def _candidate_roots():
    cache = _settings.raw("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tmp = os.path.join(tempfile.gettempdir(), f"torch_npu-{os.getuid()}")
    return [os.path.join(cache, "torch_npu"), tmp]


def _toolkit_dir(root):
    """``ascend-toolkit`` (holding ``set_env.sh`` and ``latest``) under ``root``."""
    return os.path.join(root, f"emulated-cann-{_version.cann}-layout{_LAYOUT}", "ascend-toolkit")


def export_lines(home):
    """``export NAME=value`` lines, as CANN's ``set_env.sh`` writes them, for the toolkit at ``home``."""
    values = variables_for(home)
    return [f"export {name}={shlex.quote(values[name])}" for name in VARIABLES]


def variables_for(home):
    """The CANN variables (name -> value) for the toolkit at ``home`` (its ``latest`` directory)."""
    return {"ASCEND_TOOLKIT_HOME": home, "ASCEND_HOME_PATH": home, "ASCEND_AICPU_PATH": home,
            "ASCEND_OPP_PATH": os.path.join(home, "opp"), "TOOLCHAIN_HOME": os.path.join(home, "toolkit")}


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _lay_out(toolkit):
    """Write the emulated ``ascend-toolkit`` tree into the (new, empty) directory ``toolkit``."""
    cann = _version.cann
    version_dir = os.path.join(toolkit, cann)
    os.makedirs(version_dir)
    for name in _EMPTY_DIRS:
        os.makedirs(os.path.join(version_dir, name))
    os.symlink(cann, os.path.join(toolkit, "latest"))
    arch = platform.machine() or "x86_64"
    # <arch>-linux/ascend_toolkit_install.info: "version=" must precede "innerversion=" (readers
    # take the first line containing "version").
    os.makedirs(os.path.join(version_dir, _arch_dir()))
    _write(os.path.join(version_dir, _arch_dir(), "ascend_toolkit_install.info"),
           f"package_name=Ascend-cann-toolkit\nversion={cann}\ninnerversion={cann}\n"
           f"arch={arch}\nos=linux\nemulated_by=torch_npu {_version.__version__}\n")
    _write(os.path.join(version_dir, "version.cfg"),
           "".join(f"{p}_running_version=[{cann}:{cann}]\n" for p in _PACKAGES)
           + f"toolkit_upgrade_version=[{cann}:{cann}]\n"
           + f"toolkit_installed_version=[{cann}:{cann}]\n")
    for package in ("compiler", "runtime", "opp", "toolkit"):
        _write(os.path.join(version_dir, package, "version.info"), f"Version={cann}\nversion_dir={cann}\n")


def _create(toolkit):
    """Create ``toolkit`` atomically: build it beside its final place, then rename it there.

    A concurrent creator (another rank) that renames first wins; its tree is identical."""
    parent = os.path.dirname(toolkit)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".ascend-toolkit.", dir=parent)
    try:
        _lay_out(staging)
        home = os.path.join(toolkit, "latest")
        _write(os.path.join(staging, "set_env.sh"),
               "# The emulated CANN toolkit of torch_npu (no NPU software is installed here).\n"
               + "\n".join(export_lines(home)) + "\n")
        try:
            os.rename(staging, toolkit)
            staging = None
        except OSError:
            if not os.path.isdir(os.path.join(toolkit, "latest")):
                raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def toolkit_home(create=True):
    """The emulated toolkit's ``latest`` directory (what ``ASCEND_HOME_PATH`` points at).

    The first writable candidate root is used; the tree is created there when missing and
    ``create`` is true. Raises ``OSError`` naming every place tried when none can hold it."""
    errors = []
    for root in _candidate_roots():
        toolkit = _toolkit_dir(root)
        home = os.path.join(toolkit, "latest")
        if os.path.isdir(home):
            return home
        if not create:
            continue
        try:
            _create(toolkit)
            return home
        except OSError as e:
            errors.append(f"{toolkit}: {e}")
    if not create:
        return os.path.join(_toolkit_dir(_candidate_roots()[0]), "latest")
    raise OSError("cannot create the emulated CANN toolkit; tried " + "; ".join(errors))


def _switch_on():
    return _settings.get(SWITCH)


def apply_to_process_env():
    """At import: export the CANN variables for this process and its children.

    Does nothing when ``TORCH_NPU_EMU_CANN_ENV=0`` or when the user has set
    ``ASCEND_HOME_PATH`` or ``ASCEND_TOOLKIT_HOME`` (their own CANN environment, never
    overridden nor mixed with the emulated one). Otherwise sets each variable of
    :data:`VARIABLES` that is unset, pointing at :func:`toolkit_home`. Returns what it
    set (name -> value). If the toolkit cannot be created it warns and sets nothing."""
    if not _switch_on() or any(_settings.raw(name) for name in _ROOTS):
        return {}
    try:
        home = toolkit_home()
    except OSError as e:
        warnings.warn(f"torch_npu: the CANN environment variables are not set: {e}. Set {SWITCH}=0 to "
                      f"silence this, or export ASCEND_HOME_PATH yourself.")
        return {}
    for name, value in variables_for(home).items():
        if not _settings.raw(name):
            os.environ[name] = value
            _exported[name] = value
    return dict(_exported)


def origins():
    """For each CANN variable: ``{"value", "source"}``, ``source`` being one of
    :data:`SET_AT_IMPORT` (exported by this process's import of torch_npu),
    :data:`INHERITED_EMULATED` (inherited and pointing into the emulated toolkit: from
    ``eval "$(torch-npu env)"`` or a parent process that imported torch_npu),
    :data:`USER` (the user's own value) or ``"unset"``."""
    emulated = os.path.dirname(toolkit_home(create=False))
    out = {}
    for name in VARIABLES:
        value = _settings.raw(name)
        if not value:
            source = "unset"
        elif _exported.get(name) == value:
            source = SET_AT_IMPORT
        elif os.path.realpath(value).startswith(os.path.realpath(emulated) + os.sep):
            source = INHERITED_EMULATED
        else:
            source = USER
        out[name] = {"value": value, "source": source}
    return out
