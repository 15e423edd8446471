"""Rewriting a wheel with fewer or smaller files, keeping it installable: every file it keeps is
listed in its ``RECORD`` with the sha256 and size it now has (PEP 376 / 427).

- :func:`slim` drops files by path prefix: Ray's Java jars (31 MB of its 79 MB wheel, for the
  Java API, which GraftPool never calls), RLlib and the dashboard's prebuilt web client.
- :func:`strip_binaries` runs ``strip --strip-unneeded`` on the ELF files a wheel carries
  (shared objects and executables), keeping each one whose stripped copy ``strip`` wrote, except
  the libraries auditwheel vendored (``<dist>.libs/``): those were rewritten by patchelf, and a
  stripped copy of numpy's OpenBLAS no longer loads ("ELF load command address/offset not
  page-aligned"). The wheelhouse strips Ray's only (its raylet, GCS server and ``_raylet.so``
  carry ~41 MB of symbols), which its first step then runs.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

RAY_SLIM = ("ray/jars/", "ray/rllib/", "ray/dashboard/client/build/")
"""What a slimmed Ray wheel leaves out (the Java API's jars, RLlib, the dashboard's web client)."""


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def rewrite(wheel: Path, out: Path, transform: Callable[[str, bytes], bytes | None]) -> tuple[int, int]:
    """``wheel`` copied to ``out`` with each file passed through ``transform(name, data)`` (None:
    left out), and its RECORD rewritten. Returns (files dropped, files changed)."""
    dropped = changed = 0
    with zipfile.ZipFile(wheel) as src:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        kept: list[tuple[zipfile.ZipInfo, bytes]] = []
        for info in src.infolist():
            if info.filename == record_name or info.is_dir():
                continue
            data = src.read(info)
            new = transform(info.filename, data)
            if new is None:
                dropped += 1
                continue
            changed += new != data
            kept.append((info, new))
    rows = [record_line(info.filename, data) for info, data in kept] + [[record_name, "", ""]]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info, data in kept:
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        dst.writestr(record_name, text.getvalue())
    os.replace(tmp, out)
    return dropped, changed


def slim(wheel: Path, prefixes: Iterable[str] = RAY_SLIM) -> int:
    """Drop every file under ``prefixes`` from ``wheel`` in place; returns how many."""
    prefixes = tuple(prefixes)
    dropped, _ = rewrite(wheel, wheel, lambda name, data: None if name.startswith(prefixes) else data)
    return dropped


def _stripped(data: bytes, strip: str) -> bytes:
    """``data`` (an ELF file) through ``strip --strip-unneeded``; unchanged where it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "binary"
        path.write_bytes(data)
        done = subprocess.run([strip, "--strip-unneeded", str(path)], capture_output=True, check=False)
        return path.read_bytes() if done.returncode == 0 else data


def strip_binaries(wheel: Path) -> int:
    """Strip the ELF files of ``wheel`` in place (``strip`` from binutils); returns how many it
    changed, 0 without ``strip``."""
    strip = shutil.which("strip")
    if strip is None:
        return 0
    def maybe(name: str, data: bytes) -> bytes:
        vendored = name.split("/", 1)[0].endswith(".libs")
        return _stripped(data, strip) if data[:4] == b"\x7fELF" and not vendored else data

    _, changed = rewrite(wheel, wheel, maybe)
    return changed


def stub_wheel(folder: Path, name: str, version: str) -> Path:
    """An empty wheel that only says ``name`` ``version`` is there (no files, no requirements):
    what the resolver is given for a package the node already has, so that it resolves the rest
    against it without looking up that package or what it needs."""
    dist = f"{name.replace('-', '_')}-{version}"
    wheel = folder / f"{dist}-py3-none-any.whl"
    files = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: graftpool\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [record_line(n, data) for n, data in files.items()] + [[f"{dist}.dist-info/RECORD", "", ""]]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as out:
        for n, data in files.items():
            out.writestr(n, data)
        out.writestr(f"{dist}.dist-info/RECORD", text.getvalue())
    return wheel
