"""The C heap's bytes in use, sampled: the CPU's stand-in for ``torch.cuda.max_memory_allocated``.

A process's peak RSS (``VmHWM``) counts what the process needs plus what glibc keeps after a
free (blocks under its mmap threshold go back to the arena, not to the system) and its file
mappings (libraries, safetensors weights); two settings of one trainer can differ by a
gigabyte of RSS through glibc alone (benchmarks/results/measured.md). ``mallinfo2`` reports
the bytes malloc has handed out and not yet got back, in the arenas (``uordblks``) and in
their own mappings (``hblkhd``): what the process's tensors and buffers hold at that moment.
:class:`HeapPeak` samples it from a thread (torch's kernels release the GIL) every
``every_s``: a peak shorter than that can be missed, alike in every setting measured.
glibc only (Linux); elsewhere :func:`heap_in_use_mib` is None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _mallinfo2()


def heap_in_use_mib() -> float | None:
    """Bytes malloc has handed out and not got back (``uordblks + hblkhd``), MiB; None off glibc."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return (info.uordblks + info.hblkhd) / 2**20


class HeapPeak:
    """``with HeapPeak() as heap: ...``; then ``heap.peak_mib``: the highest sample taken."""

    def __init__(self, every_s: float = 0.002) -> None:
        self.every_s = every_s
        self.peak_mib: float | None = heap_in_use_mib()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            now = heap_in_use_mib()
            if now is not None:
                self.peak_mib = max(self.peak_mib or 0.0, now)
            time.sleep(self.every_s)

    def __enter__(self) -> HeapPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        now = heap_in_use_mib()
        if now is not None:
            self.peak_mib = max(self.peak_mib or 0.0, now)
