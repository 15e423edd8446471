"""What an offline node needs: the project's run-time requirements resolved for another Python
and platform, less what the node already has.

pip resolves for the target (``pip install --dry-run --report``, with ``--python-version``,
``--platform``, ``--abi``, ``--only-binary``), given what the node has (its ``pip freeze``, or
``--preinstalled`` pins) as empty stub wheels of those versions, so every other package is chosen
to fit them and nothing of theirs is looked up. A name without a version (a package list such as
a machine image's, not a freeze) says the node has the package in a version not known here: it
is resolved like any other and left out; the node's own version must then meet the bundle's
requirements (``install.sh``'s ``pip install --no-index`` fails naming it if it does not). The bundle
then holds the resolved packages that the requirements reach **without passing through** a
preinstalled one: torch preinstalled keeps its nvidia-* wheels out, but a package torch needs and
the project needs too stays in (:func:`closure`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


@dataclass(frozen=True)
class Target:
    """The node the bundle is for: its Python (``3.12``), platform tags (pip's ``--platform``,
    most specific first) and what it already has (name -> version, or None: some version)."""

    python: str = "3.12"
    platforms: tuple[str, ...] = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
    preinstalled: Mapping[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+", self.python):
            raise ValueError(f"--python: expected a version like 3.12, got {self.python!r}")

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def pip_args(self) -> list[str]:
        """pip's options that make it resolve and download for this target, not this machine."""
        args = ["--python-version", self.python, "--implementation", "cp", "--abi", self.abi,
                "--only-binary=:all:"]
        for platform in self.platforms:
            args += ["--platform", platform]
        return args

    def marker_env(self) -> dict[str, str]:
        """The environment markers of the target (PEP 508), for dependency closure."""
        machine = "aarch64" if any("aarch64" in p for p in self.platforms) else "x86_64"
        return {"python_version": self.python, "python_full_version": f"{self.python}.0",
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                "platform_machine": machine, "extra": ""}


def parse_pins(lines: Iterable[str]) -> dict[str, str | None]:
    """``name==version`` lines (a ``pip freeze``; comments, editables and URLs skipped) as
    canonical name -> version, and bare ``name`` lines (a package list) as name -> None; other
    specifiers are refused, naming the line."""
    pins = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith(("-e ", "--")):
            continue
        if " @ " in line:
            continue  # installed from a URL or a path: nothing to resolve against
        if re.fullmatch(r"[A-Za-z0-9._-]+", line):
            pins[canonicalize_name(line)] = None  # the node has some version of it
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if not match:
            raise ValueError(f"preinstalled: expected name==version or a bare name, got {line!r}")
        # a local label (2.11.0+cu128) is the site's build of that release: pinned as the release
        pins[canonicalize_name(match.group(1))] = match.group(2).split("+")[0]
    return pins


def _requires(requires_dist: Iterable[str], extras: Iterable[str], env: Mapping[str, str]) -> list[Requirement]:
    """The requirements of one distribution that apply on the target with the given extras, each
    as its name and extras alone (its marker, already evaluated here, dropped)."""
    out = []
    for text in requires_dist:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": extra}) for extra in ["", *extras]):
            out.append(Requirement(req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else "")))
    return out


def closure(roots: Iterable[str], report: list[dict], target: Target) -> dict[str, str]:
    """name -> version of the resolved packages (``report``: pip's ``--report`` ``install``
    items) that the ``roots`` requirements reach without passing through a package the target
    has (``target.preinstalled``)."""
    resolved = {canonicalize_name(item["metadata"]["name"]): item for item in report}
    preinstalled = {canonicalize_name(name) for name in target.preinstalled}
    env = target.marker_env()
    wanted: dict[str, set[str]] = {}  # name -> extras asked for
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in preinstalled or name not in resolved:
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        extras = set(req.extras)
        if name in wanted and extras <= wanted[name]:
            continue
        wanted[name] = wanted.get(name, set()) | extras
        metadata = resolved[name]["metadata"]
        todo += _requires(metadata.get("requires_dist", []), wanted[name], env)
    return {name: resolved[name]["metadata"]["version"] for name in sorted(wanted)}

