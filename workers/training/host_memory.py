"""How the trainer's process takes host memory from the C allocator (glibc ``malloc``).

glibc serves an allocation at or above its mmap threshold with its own ``mmap``, returned to
the system when freed; smaller ones come from heaps that keep freed memory for later. The
threshold starts at 128 KiB and, by default, rises to the size of each mmapped block freed (up
to 32 MiB): after the first micro-batch, almost every activation tensor of a training step is
served from the heaps, and blocks freed by one micro-batch are reused by the next only where
they fit. The process's peak resident size (``VmHWM``) then exceeds what is live at any time:
measured on the 13.7 M benchmark model, 128 responses of 256 tokens, 9,696 tokens per
micro-batch, a peak of 3,062-3,162 MiB against a bound of 3,096 MiB on the live tensors
(``benchmarks.step_sweep.trainer_rss_bound``), and 2.2-2.6 GiB kept after the step.

``models[].trainer.mmap_threshold_mib`` > 0 fixes the threshold (``mallopt(M_MMAP_THRESHOLD)``,
which also stops it rising): tensors of that size or more are mmapped and freed back at once.
Same work: 2,138-2,209 MiB peak, 0.6 GiB after the step, for 10-25% more trainer time (each
block's pages are faulted in and zeroed anew). In ``make bench-step``'s length sweep (same day,
13.7 M model, threshold 8 MiB against 0): trainer peak 2,433 vs 3,518 MiB at 256 new tokens and
2,343 vs 3,395 at 1,024 (both now within the bound, 3,168 and 2,973), train phase 42.3 vs 36.1 s
and 211.7 vs 189.2 s. 0 leaves glibc's default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import warnings

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MAX_MMAP_THRESHOLD_MIB = 32  # glibc caps the threshold at HEAP_MAX_SIZE / 2 on 64-bit (32 MiB)


def set_mmap_threshold(mib: float) -> bool:
    """Fix glibc's mmap threshold at ``mib`` MiB for this process (True); False, with a warning,
    where the C library is not glibc or refuses the value. ``mib`` <= 0: nothing is changed."""
    if mib <= 0:
        return False
    if mib > MAX_MMAP_THRESHOLD_MIB:
        raise ValueError(f"models[].trainer.mmap_threshold_mib: at most {MAX_MMAP_THRESHOLD_MIB} "
                         f"(glibc's limit), got {mib}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        warnings.warn("models[].trainer.mmap_threshold_mib: this C library has no mallopt (not glibc); "
                      "ignored", stacklevel=2)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, int(mib * 2**20)) != 1:
        warnings.warn(f"models[].trainer.mmap_threshold_mib: mallopt refused {mib} MiB; ignored", stacklevel=2)
        return False
    return True
