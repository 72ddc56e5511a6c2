"""``torch-npu migrate PATH…``: report CUDA-only code; ``--fix`` / ``--diff`` rewrite the safe part.

Exit code: 0 when nothing is left to port, 1 when findings remain (after ``--fix``: the ones
it could not fix), 2 when a file could not be parsed.

Fast by construction: nothing here imports torch (the rules are source-text facts), the parser
is the standard library's ``ast``, a file whose text names nothing CUDA-related is not parsed at
all, and many files are scanned by several processes.
"""
import concurrent.futures
import difflib
import json
import multiprocessing
import os
import re

import click

from . import _npu_names

# Every rule needs one of these words in the source text (names are matched as written, strings
# by value, and a string spelling "cuda" with escapes is the one case this misses): a file
# without any cannot have a finding, and is not parsed.
_TRIGGER = re.compile("|".join(["cuda", "cudnn", "nccl", "nvidia", "nvtx", "dataparallel", "data_parallel",
                                "cpp_extension"] + sorted({k.split(".")[0] for k in _npu_names.CUDA_LIBRARIES} - {"torch"})),
                      re.IGNORECASE)
# Below this many files to parse, worker processes cost more than they save.
_PARALLEL_MIN_FILES = 16

_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "site-packages", "node_modules", ".tox",
              "build", "dist"}


def python_files(paths):
    """The ``.py`` files named or found under the given paths, sorted per directory."""
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
                for name in sorted(files):
                    if name.endswith(".py"):
                        yield os.path.join(root, name)
        else:
            yield path


def _text_report(results, fixed):
    lines = []
    for path, findings in results:
        for f in findings:
            state = "fixable" if f.fixable else "manual"
            lines.append(f"{path}:{f.line}:{f.column}: {f.kind}: {f.code} -> {f.replacement} [{state}]")
    total = sum(len(f) for _, f in results)
    files = sum(1 for _, f in results if f)
    fixable = sum(1 for _, fs in results for f in fs if f.fixable)
    if fixed:
        lines.append(f"{fixed} finding(s) fixed; {total} remaining in {files} file(s) (manual port needed).")
    else:
        lines.append(f"{total} finding(s) in {files} file(s): {fixable} fixable with --fix, "
                     f"{total - fixable} need a manual port.")
    return "\n".join(lines)


def _scan(path, rewrite):
    """One file: ``(findings, source, new_source, error)``; ``new_source`` only when ``rewrite``."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (UnicodeDecodeError, OSError) as e:
        return [], None, None, _first_line(e)
    if not _TRIGGER.search(source):
        return [], source, source, None
    from . import _cuda_rules
    try:
        findings, new_source = _cuda_rules.check(source, fix=rewrite)
    except SyntaxError as e:
        return [], source, None, f"line {e.lineno}: {e.msg}" if e.lineno else _first_line(e)
    except (ValueError, RecursionError, MemoryError) as e:  # a NUL byte; nesting too deep for the parser
        return [], source, None, _first_line(e)
    return findings, source, new_source, None


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


def _scan_all(paths, rewrite, jobs):
    """``_scan`` of every path, in order; in ``jobs`` processes when there are many files to parse."""
    paths = list(paths)
    if jobs is None:
        jobs = os.cpu_count() or 1
    if jobs > 1 and len(paths) >= _PARALLEL_MIN_FILES:
        try:
            context = multiprocessing.get_context("fork")
        except ValueError:  # no fork (Windows, macOS default): one process
            context = None
        if context is not None:
            with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(paths) // 8 or 1),
                                                        mp_context=context) as pool:
                return list(pool.map(_scan, paths, [rewrite] * len(paths), chunksize=4))
    return [_scan(path, rewrite) for path in paths]


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Report format.")
@click.option("--fix", is_flag=True, help="Rewrite the safely fixable findings in place (formatting and "
                                          "comments kept).")
@click.option("--diff", "show_diff", is_flag=True, help="Print the --fix rewrite as a unified diff; change "
                                                        "no file.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Processes that scan files (default: the number of CPUs).")
@click.pass_context
def migrate(ctx, paths, fmt, fix, show_diff, jobs):
    """Find CUDA-only constructs in Python files and say what to use on the NPU."""
    results, errors, fixed = [], [], 0
    diffs = []
    files = list(python_files(paths))
    for path, (findings, source, new_source, error) in zip(files, _scan_all(files, fix or show_diff, jobs)):
        if error is not None:
            errors.append({"path": path, "error": error})
            continue
        if (fix or show_diff) and new_source != source:
            if show_diff:
                diffs.append("".join(difflib.unified_diff(source.splitlines(True), new_source.splitlines(True),
                                                          f"a/{path.lstrip('/')}", f"b/{path.lstrip('/')}")))
            if fix:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new_source)
                fixed += sum(1 for x in findings if x.fixable)
                findings = [x for x in findings if not x.fixable]
        results.append((path, findings))

    remaining = sum(len(f) for _, f in results)
    if show_diff:
        click.echo("".join(diffs), nl=False)
    elif fmt == "json":
        click.echo(json.dumps({
            "findings": [dict(path=p, **f.as_dict()) for p, fs in results for f in fs],
            "fixed": fixed,
            "errors": errors,
        }, indent=2))
    else:
        click.echo(_text_report(results, fixed))
    for e in errors:
        if fmt != "json":
            click.echo(f"{e['path']}: cannot parse: {e['error']}", err=True)
    if errors:
        ctx.exit(2)
    ctx.exit(1 if remaining else 0)
