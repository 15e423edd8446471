"""``models[].trainer.mmap_threshold_mib``: glibc's mmap threshold fixed in a trainer's process
(``workers.training.host_memory``), read back from glibc itself (``mallinfo2``: bytes held in
mmapped blocks). Each case runs in a fresh interpreter, so that the test process's allocator
keeps its defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, load_config
from workers.training.host_memory import set_mmap_threshold

# After a 4 MiB block is freed, is a 2 MiB tensor mmapped (True) or served from a heap (False)?
PROBE = """
import ctypes, sys, torch
from workers.training.host_memory import set_mmap_threshold
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
mib = float(sys.argv[1])
if mib:
    assert set_mmap_threshold(mib)
big = torch.ones(2**20)  # 4 MiB: mmapped (over the 128 KiB start), then freed:
del big                  # glibc's default threshold rises to 4 MiB here
before = libc.mallinfo2().hblkhd
tensor = torch.ones(2**19)  # 2 MiB
print(libc.mallinfo2().hblkhd - before >= 2**21)
"""


def _mmapped_after_a_free(mib: float) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE, str(mib)], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_fixed_threshold_keeps_mid_sized_tensors_mmapped_where_the_default_threshold_rose():
    assert not _mmapped_after_a_free(0), "glibc's default: the threshold rose to 4 MiB, the tensor is on a heap"
    assert _mmapped_after_a_free(1), "fixed at 1 MiB: the 2 MiB tensor is mmapped, returned to the system when freed"


def test_the_setting_is_range_checked_where_it_is_read_and_where_it_is_applied():
    assert set_mmap_threshold(0) is False, "0: glibc's default, mallopt not called"
    with pytest.raises(ValueError, match="mmap_threshold_mib: at most 32"):
        set_mmap_threshold(64)
    demo = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"
    with pytest.raises(ConfigError, match="models.0.trainer.mmap_threshold_mib"):
        load_config(demo, ["models.0.trainer.mmap_threshold_mib=64"])
    assert load_config(demo, ["models.0.trainer.mmap_threshold_mib=8"]).models[0].trainer.mmap_threshold_mib == 8
