"""kvmem's PEP 517 build backend: the standard library and CMake, nothing else.

``pip install ./bindings/python`` needs no package from an index: pyproject.toml
names this file (``backend-path``) and requires nothing, so a plain
``python3 -m venv`` of any Python >= 3.9 builds it offline, with or without
build isolation. The wheel carries the Python package, ``libkvmem.so.0`` beside
it (the loader's first place after KVMEM_LIBRARY) and the ``kvmem`` tool
(installed into the environment's bin/), both built by CMake from the C
sources: the checkout this folder sits in, or the ``_csrc`` copy an sdist
carries.

The wheel is tagged ``py3-none-<platform>``: the Python code runs on any
Python 3, the binaries only here. On Linux with glibc the platform is
``manylinux_X_Y_<arch>``, X.Y the newest glibc symbol version the two binaries
need (read from their ELF version records below), so pip installs the wheel
on exactly the systems whose glibc has them; elsewhere ``linux_<arch>``.

Progress: the CMake build's lines go to stderr (shown by ``pip install -v``
and ``python -m build``); pip hides a backend's output otherwise, so while it
does (stderr not a terminal) every tenth percent also goes to the terminal
pip runs in (/dev/tty), when there is one. KVMEM_BUILD_DIR names the CMake
build directory (default build/cmake here): several packages share one build
and a rebuild compiles only what changed. Needs cmake and a C11 compiler.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

HERE = Path(__file__).resolve().parent.parent  # bindings/python (or an unpacked sdist)
# What a KVMEM_LIBRARY_ONLY configure with the tool reads, relative to the repository root.
C_SOURCES = ("CMakeLists.txt", "cmake", "core", "include", "tools", "bench", "synth",
             "backends/vulkan/vk_ops.h", "backends/cuda/kvmem_cuda.h")
# The same configuration as bindings/node/scripts/build.js and scripts/test-bindings.sh:
# one build directory serves all three (the Node package's sources have no tools/).
CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DKVMEM_LIBRARY_ONLY=ON", "-DKVMEM_CUDA=OFF", "-DKVMEM_VULKAN=OFF",
              "-DKVMEM_BUILD_TESTS=OFF", "-DKVMEM_BUILD_TOOLS=ON", "-DKVMEM_BUILD_BENCH=ON")
LIB = "libkvmem.0.dylib" if sys.platform == "darwin" else "libkvmem.so.0"
TOOL = "kvmem.exe" if sys.platform == "win32" else "kvmem"


# ---------------------------------------------------------------------------
# Metadata: pyproject.toml's [project] table
# ---------------------------------------------------------------------------

def _toml_subset(text: str) -> Dict[str, Any]:
    """The part of TOML this project's pyproject.toml uses (tables, strings,
    arrays of strings, inline tables of strings), for Pythons before tomllib."""
    out: Dict[str, Any] = {}
    table = out
    lines = iter(text.splitlines())
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.\-]+)\]", line)
        if m:
            table = out
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        while value.startswith("[") and value.count("[") > value.count("]"):
            value += " " + next(lines).strip()
        table[key.strip().strip('"')] = _toml_value(value)
    return out


def _toml_value(v: str) -> Any:
    v = re.sub(r"\s+#[^\"']*$", "", v).strip()
    if v.startswith('"'):
        return v[1:v.index('"', 1)]
    if v.startswith("["):
        return [_toml_value(x) for x in re.findall(r'"[^"]*"', v)]
    if v.startswith("{"):
        return {k.strip(): _toml_value(x.strip()) for k, x in
                (p.split("=", 1) for p in v.strip("{} ").split(",") if "=" in p)}
    if v in ("true", "false"):
        return v == "true"
    return v


def _pyproject(src: Path = HERE) -> Dict[str, Any]:
    text = (src / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return _toml_subset(text)
    return tomllib.loads(text)


def _project(src: Path = HERE) -> Dict[str, Any]:
    return _pyproject(src)["project"]


def _dist_name(p: Dict[str, Any]) -> str:
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


def _metadata(src: Path = HERE) -> str:
    """The core metadata (METADATA / PKG-INFO), version 2.1."""
    p = _project(src)
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "license" in p:
        lines.append(f"License: {p['license'].get('text', '')}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    for label, url in p.get("urls", {}).items():
        lines.append(f"Project-URL: {label}, {url}")
    for c in p.get("classifiers", []):
        lines.append(f"Classifier: {c}")
    for d in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {d}")
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    body = ""
    if "readme" in p:
        lines.append("Description-Content-Type: text/markdown")
        body = "\n" + (src / p["readme"]).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n" + body


# ---------------------------------------------------------------------------
# The C build
# ---------------------------------------------------------------------------

def _c_sources() -> Path:
    for d in (HERE / "_csrc", HERE.parent.parent):  # an sdist's copy, else the checkout
        if (d / "include" / "kvmem.h").is_file() and (d / "core" / "CMakeLists.txt").is_file():
            return d
    raise SystemExit("kvmem: the C sources are missing: build from a kvmem checkout (bindings/python) "
                     "or from an sdist made there (python -m build --sdist, or pip wheel)")


class _Progress:
    """CMake's lines to stderr; while stderr is captured (pip), each tenth
    percent to the terminal as well."""

    def __init__(self) -> None:
        self.tty = None
        self.step = -1
        self.t0 = time.monotonic()
        if not sys.stderr.isatty():
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)
        if self.tty is not None:
            try:
                self.tty.write(text + "\n")
                self.tty.flush()
            except OSError:
                self.tty = None

    def line(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)
        m = re.match(r"\[\s*(\d+)%\]", text)
        if m and self.tty is not None and int(m.group(1)) // 10 > self.step:
            self.step = int(m.group(1)) // 10
            try:
                self.tty.write(f"kvmem: building libkvmem and the kvmem tool: {m.group(1)}% "
                               f"({time.monotonic() - self.t0:.0f} s)\n")
                self.tty.flush()
            except OSError:
                self.tty = None

    def close(self) -> None:
        if self.tty is not None:
            self.tty.close()


def _run(cmd: List[str], progress: _Progress) -> None:
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    except OSError as e:
        raise SystemExit(f"kvmem: cannot run {cmd[0]}: {e}")
    assert proc.stdout is not None
    for line in proc.stdout:
        progress.line(line.rstrip("\n"))
    if proc.wait() != 0:
        raise SystemExit(f"kvmem: {' '.join(cmd)} failed (exit {proc.returncode})")


def build_c(build_dir: Optional[Path] = None) -> Tuple[Path, Optional[Path]]:
    """libkvmem and the kvmem tool built with CMake: (library, tool or None)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("kvmem: building libkvmem needs cmake and a C compiler "
                         "(Debian: apt-get install cmake build-essential)")
    bld = Path(os.environ.get("KVMEM_BUILD_DIR") or build_dir or HERE / "build" / "cmake").resolve()
    src = _c_sources()
    progress = _Progress()
    try:
        progress.say(f"kvmem: building libkvmem and the kvmem tool from {src} in {bld} (CMake, Release)")
        _run([cmake, "-S", str(src), "-B", str(bld), *CMAKE_ARGS], progress)
        targets = ["kvmem"] + (["kvmem_cli"] if (src / "tools" / "CMakeLists.txt").is_file() else [])
        _run([cmake, "--build", str(bld), "--target", *targets, "-j", str(os.cpu_count() or 2)], progress)
        progress.say(f"kvmem: built in {time.monotonic() - progress.t0:.0f} s")
    finally:
        progress.close()
    lib = bld / "core" / LIB
    if not lib.exists():
        raise SystemExit(f"kvmem: the CMake build in {bld} made no {LIB}")
    tool = bld / "tools" / TOOL
    return lib, tool if tool.exists() else None


# ---------------------------------------------------------------------------
# Platform tag
# ---------------------------------------------------------------------------

def glibc_needs(path: Path) -> List[Tuple[int, int]]:
    """The GLIBC_X.Y versions an ELF file's symbols are bound to (its
    .gnu.version_r records), as (X, Y); [] for a file that needs none."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []  # not a 64-bit little-endian ELF
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _name, typ, _flags, _addr, off, size, link, info, _align, _entsize in sections:
        if typ != 0x6FFFFFFE:  # SHT_GNU_verneed
            continue
        strtab = sections[link][4]
        at = off
        for _ in range(info):
            _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, at)
            a = at + aux
            for _ in range(cnt):
                _hash, _flags2, _other, name, anext = struct.unpack_from("<IHHII", data, a)
                end = data.index(b"\0", strtab + name)
                m = re.fullmatch(rb"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", data[strtab + name:end])
                if m:
                    out.append((int(m.group(1)), int(m.group(2))))
                a += anext
            if not nxt:
                break
            at += nxt
    return out


def platform_tag(binaries: List[Path]) -> str:
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if not plat.startswith("linux"):
        return plat
    arch = plat[len("linux_"):]
    libc, _ = __import__("platform").libc_ver()
    needs = [v for b in binaries for v in glibc_needs(b)]
    if libc != "glibc" or not needs:
        return plat
    major, minor = max(needs)
    return f"manylinux_{major}_{minor}_{arch}"


# ---------------------------------------------------------------------------
# Archives
# ---------------------------------------------------------------------------

def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class _Wheel:
    """A wheel being written: files with their RECORD lines."""

    def __init__(self, path: Path, dist_info: str):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.dist_info = dist_info
        self.record: List[str] = []

    def add(self, arcname: str, data: bytes, mode: int = 0o644) -> None:
        info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        self.record.append(f"{arcname},{_record_hash(data)},{len(data)}")

    def close(self) -> None:
        rec = f"{self.dist_info}/RECORD"
        self.record.append(f"{rec},,")
        info = zipfile.ZipInfo(rec, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        self.zip.writestr(info, "\n".join(self.record) + "\n")
        self.zip.close()


def _package_files() -> Iterator[Tuple[str, Path]]:
    pkg = HERE / "kvmem"
    for f in sorted(pkg.iterdir()):
        if f.suffix in (".py", ".typed") and f.is_file():
            yield f"kvmem/{f.name}", f


def _license() -> Optional[Path]:
    for d in (HERE, HERE.parent.parent):
        if (d / "LICENSE").is_file():
            return d / "LICENSE"
    return None


def _dist_info_files(tag: str) -> Dict[str, bytes]:
    files = {
        "METADATA": _metadata().encode(),
        "WHEEL": (f"Wheel-Version: 1.0\nGenerator: kvmem_backend\nRoot-Is-Purelib: false\nTag: {tag}\n").encode(),
    }
    lic = _license()
    if lic is not None:
        files["LICENSE"] = lic.read_bytes()
    return files


def _write_wheel(wheel_directory: str, editable: bool) -> str:
    p = _project()
    name, version = _dist_name(p), p["version"]
    lib, tool = build_c()
    tag = "py3-none-" + platform_tag([lib] + ([tool] if tool else []))
    filename = f"{name}-{version}-{tag}.whl"
    dist_info = f"{name}-{version}.dist-info"
    whl = _Wheel(Path(wheel_directory) / filename, dist_info)
    try:
        if editable:
            # the package is imported from this folder; the library is put beside it
            shutil.copyfile(lib.resolve(), HERE / "kvmem" / lib.name)
            whl.add(f"__editable__.{name}.pth", (str(HERE) + "\n").encode())
        else:
            for arc, f in _package_files():
                whl.add(arc, f.read_bytes())
            whl.add(f"kvmem/{lib.name}", lib.resolve().read_bytes(), 0o755)
        if tool is not None:  # the kvmem tool, installed into the environment's bin/
            whl.add(f"{name}-{version}.data/scripts/{tool.name}", tool.read_bytes(), 0o755)
        for fname, data in _dist_info_files(tag).items():
            whl.add(f"{dist_info}/{fname}", data)
    finally:
        whl.close()
    return filename


# ---------------------------------------------------------------------------
# PEP 517 / PEP 660 hooks
# ---------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings: Any = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Any = None) -> List[str]:
    return []


def _prepare_metadata(metadata_directory: str) -> str:
    p = _project()
    dist_info = f"{_dist_name(p)}-{p['version']}.dist-info"
    d = Path(metadata_directory) / dist_info
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata(), encoding="utf-8")
    lic = _license()
    if lic is not None:
        shutil.copyfile(lic, d / "LICENSE")
    return dist_info


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> str:
    return _prepare_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: Any = None) -> str:
    return _prepare_metadata(metadata_directory)


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    return _write_wheel(wheel_directory, editable=False)


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    return _write_wheel(wheel_directory, editable=True)


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    """kvmem-X.tar.gz: this folder's sources, LICENSE and the C sources under _csrc/."""
    p = _project()
    base = f"{_dist_name(p)}-{p['version']}"
    path = Path(sdist_directory) / f"{base}.tar.gz"

    def add_bytes(tar: tarfile.TarFile, arc: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(f"{base}/{arc}")
        info.size, info.mode, info.mtime = len(data), mode, 1767225600
        tar.addfile(info, io.BytesIO(data))

    def add_tree(tar: tarfile.TarFile, src: Path, arc: str) -> None:
        if src.is_dir():
            for f in sorted(src.rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    add_bytes(tar, f"{arc}/{f.relative_to(src).as_posix()}", f.read_bytes(), f.stat().st_mode & 0o777)
        else:
            add_bytes(tar, arc, src.read_bytes())

    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in ("pyproject.toml", "README.md", "backend/kvmem_backend.py"):
            add_tree(tar, HERE / rel, rel)
        for arc, f in _package_files():
            add_tree(tar, f, arc)
        lic = _license()
        if lic is not None:
            add_tree(tar, lic, "LICENSE")
        src = _c_sources()
        for rel in C_SOURCES:
            if (src / rel).exists():
                add_tree(tar, src / rel, f"_csrc/{rel}")
        add_bytes(tar, "PKG-INFO", _metadata().encode())
    return path.name


if __name__ == "__main__":  # python backend/kvmem_backend.py DIR: a wheel without pip
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    print(Path(out) / build_wheel(out))
