"""The package's own PEP 517 backend (backend/kvmem_backend.py): its TOML
reader (for Pythons before tomllib) reads pyproject.toml as tomllib does, the
metadata says what pyproject.toml says, the glibc versions it reads from an
ELF file are the ones the file binds, and an sdist carries everything a build
needs. (Building and installing wheels: scripts/test-packages.sh.)"""
from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import kvmem

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "backend"))
import kvmem_backend as B  # noqa: E402

REPO = HERE.parents[1]


def test_the_toml_subset_reads_pyproject_as_tomllib_does():
    tomllib = pytest.importorskip("tomllib", reason="skipped: tomllib is Python 3.11+")
    text = (HERE / "pyproject.toml").read_text()
    assert B._toml_subset(text) == tomllib.loads(text)


def test_metadata_versions_and_license_agree():
    p = B._project()
    meta = B._metadata()
    header = (REPO / "include" / "kvmem.h").read_text()
    version = re.search(r'#define KVMEM_VERSION_STRING "(.*)"', header).group(1)
    assert f"Version: {p['version']}\n" in meta and p["version"] == kvmem.__version__ == version
    assert "License: MIT\n" in meta and "Requires-Python: >=3.9\n" in meta
    assert 'Requires-Dist: numpy; extra == "numpy"' in meta
    assert "MIT License" in B._license().read_text()


def test_glibc_needs_are_what_the_elf_file_binds():
    lib = Path(kvmem.LIBRARY_PATH)
    needs = B.glibc_needs(lib)
    assert needs, f"{lib} binds no GLIBC_ version"
    try:
        out = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("skipped: objdump not found (apt-get install binutils)")
    seen = {tuple(int(x) for x in m.split(".")[:2]) for m in re.findall(r"\(GLIBC_(\d+\.\d+(?:\.\d+)?)\)", out)}
    assert set(needs) == seen
    assert B.glibc_needs(HERE / "pyproject.toml") == []  # not an ELF file


def test_the_sdist_carries_what_a_build_needs(tmp_path):
    name = B.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as t:
        names = set(t.getnames())
    base = name[:-len(".tar.gz")]
    for rel in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO", "backend/kvmem_backend.py",
                "kvmem/__init__.py", "kvmem/py.typed", "_csrc/CMakeLists.txt", "_csrc/include/kvmem.h",
                "_csrc/core/CMakeLists.txt", "_csrc/tools/CMakeLists.txt", "_csrc/bench/bench.h",
                "_csrc/backends/vulkan/vk_ops.h", "_csrc/backends/cuda/kvmem_cuda.h"):
        assert f"{base}/{rel}" in names, rel
