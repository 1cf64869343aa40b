"""The README's usage example runs and prints what its comment says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path


def test_readme_example_runs():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    promised = re.search(r"print\(.*\)\s+# (.*)", code).group(1).strip()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().strip() == promised
