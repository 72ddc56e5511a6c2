"""Walk docs/errors.md: run every snippet, check it raises exactly the documented error.

The catalog is the single source: each ``### entry`` has one or more
```python snippets, each followed by a ```text block ``Type: message`` where
``…`` matches text that varies (timestamp, pid, source location).  An
``Environment: `VAR=value` `` line sets variables before ``import torch``.
Snippets sharing an environment run in one fresh interpreter, each in its own
temporary directory.  Entries marked **Needs: hccl** are distributed and are
checked by tests/test_dist_faults.py.
"""
import re
from pathlib import Path

import pytest

from _subproc import REPO, run_many, result

CATALOG = REPO / "docs" / "errors.md"


def parse_catalog(text):
    """[(entry title, env dict, snippet, expected text)] in document order."""
    entries, title, env, block, lang, pending = [], None, {}, None, None, None
    for line in text.splitlines():
        if block is not None:
            if line.startswith("```"):
                body = "\n".join(block)
                if lang == "python":
                    pending = body
                elif lang == "text" and pending is not None:
                    entries.append((title, dict(env), pending, body))
                    pending = None
                block = None
            else:
                block.append(line)
        elif line.startswith("```"):
            lang, block = line[3:].strip(), []
        elif line.startswith("### "):
            title, env, pending = line[4:].strip(), {}, None
        elif line.startswith("## "):
            title, env, pending = None, {}, None
        elif line.startswith("Environment:"):
            env = dict(m.split("=", 1) for m in re.findall(r"`([^`]+)`", line))
    return entries


def expected_pattern(expected):
    return re.compile(".*?".join(re.escape(part) for part in expected.split("…")), re.DOTALL)


ENTRIES = parse_catalog(CATALOG.read_text(encoding="utf-8"))

_RUNNER = r'''
import io, os, tempfile, traceback
import torch, torch_npu
SNIPPETS = {snippets!r}
outcomes = []
for code in SNIPPETS:
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            exec(compile(code, "<catalog>", "exec"), {{"torch": torch, "torch_npu": torch_npu, "io": io}})
            outcomes.append(None)
        except BaseException as e:
            outcomes.append(f"{{type(e).__name__}}: {{e}}")
        finally:
            os.chdir(here)
emit(outcomes)
'''


def _env_key(env):
    return tuple(sorted(env.items()))


@pytest.fixture(scope="module")
def outcomes():
    groups = {}
    for _, env, snippet, _ in ENTRIES:
        groups.setdefault(_env_key(env), []).append(snippet)
    jobs = {key: (_RUNNER.format(snippets=snips), dict(key)) for key, snips in groups.items()}
    raw = run_many(jobs, timeout=240)
    return {key: dict(zip(groups[key], result(raw, key))) for key in groups}


def test_catalog_is_complete():
    titles = {t for t, _, _, _ in ENTRIES}
    assert len(ENTRIES) >= 25
    text = CATALOG.read_text(encoding="utf-8")
    for section in ("Wrong device", "Index out of range", "Dtype or layout not supported", "Over capacity",
                    "Invalid environment values", "Bad `map_location`", "Corrupt or untrusted checkpoint",
                    "Unknown or invalid option", "Collective mismatch", "Dead peer"):
        assert section in text
    assert "A truncated file" in titles and "A checkpoint that carries code" in titles
    # failures that used to be silent (a stderr line, a number, a bare Python error): each one runs here
    assert {"`save_async` into a directory that does not exist", "Bytes that only start like a zip file",
            "`elapsed_time` between events on two devices", "A custom op's dimension out of range",
            "A custom op given a tensor it cannot handle"} <= titles
    # the distributed ones are checked by tests/test_dist_startup_errors.py
    for title in ("### Ranks launched with different world sizes", "### An invalid HCCL_* value on one rank"):
        assert title in text


@pytest.mark.parametrize("title,env,snippet,expected", ENTRIES,
                         ids=[f"{i}-{t}" for i, (t, _, _, _) in enumerate(ENTRIES)])
def test_catalog_entry_raises_the_documented_error(outcomes, title, env, snippet, expected):
    got = outcomes[_env_key(env)][snippet]
    assert got is not None, f"{title}: the snippet did not raise"
    assert expected_pattern(expected).fullmatch(got), f"{title}:\nexpected:\n{expected}\ngot:\n{got}"
