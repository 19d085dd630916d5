"""Builds libkvmem with CMake and ships it inside the package.

The metadata is in pyproject.toml; this file only adds the C library:
``build_py`` configures the C sources (the checkout this folder sits in, or
the ``_csrc`` copy an sdist carries) with ``KVMEM_LIBRARY_ONLY`` and copies
the shared library next to the Python files (``kvmem/libkvmem.so.0``), where
the loader looks first after ``KVMEM_LIBRARY``. Wheels are tagged for the
platform (``py3-none-<platform>``): the code is pure Python, the library not.

``KVMEM_BUILD_DIR`` names the CMake build directory to use (default: inside
setuptools' build folder), so several packages can share one build.
Needs cmake and a C11 compiler (Debian: cmake build-essential).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
# What a KVMEM_LIBRARY_ONLY configure reads, relative to the repository root.
C_SOURCES = ("CMakeLists.txt", "cmake", "core", "include")
# The same configuration as bindings/node/scripts/build.js: one build serves both.
CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DKVMEM_LIBRARY_ONLY=ON", "-DKVMEM_CUDA=OFF", "-DKVMEM_VULKAN=OFF",
              "-DKVMEM_BUILD_TESTS=OFF", "-DKVMEM_BUILD_TOOLS=OFF", "-DKVMEM_BUILD_BENCH=OFF")
LIB_NAMES = ("libkvmem.0.dylib",) if sys.platform == "darwin" else ("libkvmem.so.0",)


def c_source_dir() -> Path:
    for d in (HERE / "_csrc", HERE.parent.parent):  # an sdist's copy, else the checkout
        if (d / "include" / "kvmem.h").is_file() and (d / "core" / "CMakeLists.txt").is_file():
            return d
    raise SystemExit("kvmem: the C sources are missing: build from a kvmem checkout (bindings/python) "
                     "or from an sdist made by `python -m build --sdist` there")


def build_libkvmem(build_temp: str) -> Path:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("kvmem: building libkvmem needs cmake and a C compiler "
                         "(Debian: apt-get install cmake build-essential)")
    bld = Path(os.environ.get("KVMEM_BUILD_DIR") or Path(build_temp) / "libkvmem").resolve()
    src = c_source_dir()
    print(f"kvmem: building libkvmem from {src} in {bld} (CMake, Release)", flush=True)
    subprocess.check_call([cmake, "-S", str(src), "-B", str(bld), *CMAKE_ARGS])
    subprocess.check_call([cmake, "--build", str(bld), "--target", "kvmem", "kvmem_static",
                           "-j", str(os.cpu_count() or 2)])
    for name in LIB_NAMES:
        lib = bld / "core" / name
        if lib.exists():
            return lib
    raise SystemExit(f"kvmem: the CMake build in {bld} made no {' or '.join(LIB_NAMES)}")


class BuildPyWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        lib = build_libkvmem(self.get_finalized_command("build").build_temp)
        dest = Path(self.build_lib) / "kvmem" / lib.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib.resolve(), dest)  # the file, not the SONAME link
        os.chmod(dest, 0o755)


class SdistWithSources(sdist):
    """An sdist carries the C sources (under _csrc), so it builds anywhere."""

    def make_release_tree(self, base_dir: str, files: list) -> None:
        super().make_release_tree(base_dir, files)
        root = HERE.parent.parent
        for rel in C_SOURCES:
            src, dst = root / rel, Path(base_dir) / "_csrc" / rel
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)


class BinaryDistribution(Distribution):
    """The package carries a native library: wheels go to platlib, tagged for the platform."""

    def has_ext_modules(self) -> bool:
        return True


cmdclass = {"build_py": BuildPyWithLibrary, "sdist": SdistWithSources}

try:  # py3-none-<platform>: the Python code runs on any Python 3, libkvmem only here
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        def get_tag(self) -> tuple:
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: pip reports what it needs
    pass

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
