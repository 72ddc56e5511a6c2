"""``torch-npu migrate PATH…``: report CUDA-only code; ``--fix`` / ``--diff`` rewrite the safe part.

Exit code: 0 when nothing is left to port, 1 when findings remain (after ``--fix``: the ones
it could not fix), 2 when a file could not be parsed.
"""
import difflib
import json
import os

import click
import libcst

from torch_npu.cli import _cuda_rules

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


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Report format.")
@click.option("--fix", is_flag=True, help="Rewrite the safely fixable findings in place (formatting and "
                                          "comments kept).")
@click.option("--diff", "show_diff", is_flag=True, help="Print the --fix rewrite as a unified diff; change "
                                                        "no file.")
@click.pass_context
def migrate(ctx, paths, fmt, fix, show_diff):
    """Find CUDA-only constructs in Python files and say what to use on the NPU."""
    results, errors, fixed = [], [], 0
    diffs = []
    for path in python_files(paths):
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            findings, new_source = _cuda_rules.check(source, fix=fix or show_diff)
        except (libcst.ParserSyntaxError, UnicodeDecodeError, OSError) as e:
            errors.append({"path": path, "error": str(e).strip().splitlines()[0] if str(e).strip() else repr(e)})
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
