"""Every KVMEM_API function of include/kvmem.h is declared in kvmem._lib and
reachable from the high-level API (or listed here as deliberately low-level)."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

from kvmem import _lib
from scenario import REPO

# Functions a Python caller never needs directly: the binding builds tensor
# views itself, nothing returns caller-owned memory yet, and the *_errbuf
# forms serve bindings whose async calls run on threads they cannot run code
# on (Python calls on its own thread and reads kvmem_last_error()).
# The *_params_init functions are called by _lib's kvmem_X_default_params(),
# as by kvmem.h's inline ones.
LOW_LEVEL_ONLY = ({"kvmem_tensor_init", "kvmem_free"} | {n for n in _lib.DECLARED if n.endswith("_errbuf")}
                  | {n for n in _lib.DECLARED if n.endswith("_params_init")})


def header_names():
    names = _lib.header_functions((REPO / "include" / "kvmem.h").read_text())
    assert len(names) > 30, "the header parser found too few functions"
    return names


def test_every_public_function_is_declared():
    missing = [n for n in header_names() if n not in _lib.DECLARED]
    assert not missing, f"kvmem._lib lacks declarations for: {missing}"


def test_declared_functions_exist_in_the_library():
    assert not (_lib.MISSING & set(header_names())), \
        f"the loaded library {_lib.LIBRARY_PATH} lacks {sorted(_lib.MISSING)}"


def test_every_public_function_is_used_by_the_high_level_api():
    src = "".join(p.read_text() for p in (Path(_lib.__file__).parent).glob("_*.py") if p.name != "_lib.py")
    used = set(re.findall(r"\bL\.(kvmem_\w+)", src))
    missing = [n for n in header_names() if n not in used and n not in LOW_LEVEL_ONLY]
    assert not missing, f"no high-level wrapper calls: {missing}"


def test_prototypes_match_header():
    """The prototype comment of each declaration names the same parameters as the header."""
    hdr = re.sub(r"/\*.*?\*/", " ", (REPO / "include" / "kvmem.h").read_text(), flags=re.S)
    hdr = re.sub(r"(?m)^\s*#.*$", " ", hdr)
    for name in header_names():
        m = re.search(r"KVMEM_API\s+([^;]*?\b" + name + r"\s*\([^)]*\))", hdr)
        assert m, name
        norm = lambda s: re.sub(r"\s+", " ", s.replace("* ", "*")).replace(" *", "*").strip()
        assert norm(m.group(1)) == norm(_lib.DECLARED[name]), name


def test_struct_mirrors_match_the_compiler():
    """Every public struct is mirrored with the size the C compiler gives it
    (the fixture program records sizeof of each)."""
    from scenario import fixture
    abi = fixture()["abi"]
    hdr = (REPO / "include" / "kvmem.h").read_text()
    structs = re.findall(r"typedef struct (kvmem_\w+) \{", hdr)
    assert len(structs) >= 9
    unknown = [s for s in structs if s not in abi]
    assert not unknown, f"add {unknown} to ABI_STRUCTS in bindings/fixture/scenario.c"
    wrong = {s: (ctypes.sizeof(getattr(_lib, s)) if hasattr(_lib, s) else None, abi[s])
             for s in structs if not hasattr(_lib, s) or ctypes.sizeof(getattr(_lib, s)) != abi[s]}
    assert not wrong, f"kvmem._lib struct sizes (binding, C): {wrong}"
