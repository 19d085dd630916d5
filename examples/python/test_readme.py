"""The README's Python lines of the Bindings section run as written."""
import os
import re
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
import kvmem  # noqa: E402


def test_readme_python_lines_run():
    readme = open(os.path.join(HERE, "..", "..", "README.md")).read()
    section = readme[readme.index("## Bindings"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    T = 5
    env = {"k": np.full((32, T, 8, 128), 0.25, np.float32), "v": np.zeros((32, T, 8, 128), np.float32),
           "ids": np.arange(T, dtype=np.int32), "turn_text": "hello", "q": np.ones((2, 32, 32, 128), np.float32)}
    if kvmem.has_function("kvmem_retrieve"):
        exec(code, env)
        assert env["agent"].get_info().n_tokens == T
        assert env["hits"].n_sets == 1
    else:
        with pytest.raises(kvmem.UnsupportedError, match="kvmem_retrieve"):
            exec(code, env)
        assert env["agent"].get_info().n_tokens == T
    env["ctx"].close()
