"""The README's Python example (section "Examples") runs as written."""
import contextlib
import io
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
import kvmem  # noqa: E402,F401  (the example's `import kvmem` finds this checkout's binding)


def test_readme_python_example_runs():
    readme = open(os.path.join(HERE, "..", "..", "README.md")).read()
    section = readme[readme.index("## Examples"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, env)
    assert out.getvalue() == "recalled blocks 1 and 2: 32 tokens of memory\n"
    # the gathered values are the appended ones of those blocks (V is not rotated), as f16 stores them
    want = np.concatenate([env["v"][:, b * 16:(b + 1) * 16] for b in env["blocks"]], axis=1)
    np.testing.assert_array_equal(env["mem_v"], want.astype(np.float16).astype(np.float32))
