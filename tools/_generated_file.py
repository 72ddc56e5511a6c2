"""Writing a generated file, or checking it is current: the ``main`` of every tools/gen_*.py."""
import os
import sys


def write_or_check(path, text, argv, command):
    """With ``--check`` in ``argv``: 0 when ``path`` holds ``text``, else 1 with a message naming
    ``command`` (the regeneration command). Without it: write ``text`` to ``path`` and return 0."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shown = os.path.relpath(path, root)
    if "--check" in argv:
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"{shown} is out of date: run {command}", file=sys.stderr)
            return 1
        print(f"{shown} is up to date")
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {shown} ({text.count(chr(10))} lines)")
    return 0
