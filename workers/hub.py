"""Models named by Hugging Face hub id (``models[].path: Qwen/Qwen2.5-1.5B-Instruct``).

A ``models[].path`` that is no local file or folder, no ``package:`` reference and no ``.gguf``
file, and that has the shape of a hub repository id (``name`` or ``org/name``), names a hub
model. It is resolved through the Hugging Face cache of the machine that loads it, by
``huggingface_hub.snapshot_download``: with ``HF_HUB_OFFLINE=1`` (or no network) the cache only
(``$HF_HUB_CACHE``, default ``$HF_HOME/hub``: ``models--org--name/refs/main`` holds the commit
hash, ``snapshots/<hash>/`` the files), else a download of what the cache lacks.

The driver passes the id itself to every actor, and each actor resolves it on its own node
(:func:`model_folder`), so that a cluster without a shared disk works: a folder path resolved on
the driver would not exist on another node. The driver resolves it too, for the tokenizer and
config files only (:data:`CHECK_FILES`), to check the model before any actor starts.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_PREFIX = "package:"
"""What begins a ``models[].path`` naming a file inside a Python package (``workers.zoo.packaged``): no hub id."""

CHECK_FILES = ["*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt"]
"""What the driver's check reads of a hub model: config, tokenizer and chat template; no weights."""


def hub_id(reference: str | Path) -> str | None:
    """The hub repository id ``reference`` names, or None for a local file or folder, a
    ``package:`` reference or a ``.gguf`` file (whether or not it exists)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    text = str(reference)
    if text.startswith(PACKAGE_PREFIX) or text.lower().endswith(".gguf") or Path(text).exists():
        return None
    try:
        validate_repo_id(text)
    except HFValidationError:
        return None
    return text


def hub_settings() -> str:
    """Where this process looks for hub models, for error messages."""
    from huggingface_hub import constants

    return (f"HF_HUB_OFFLINE={int(bool(constants.HF_HUB_OFFLINE))}, Hugging Face cache searched: "
            f"{constants.HF_HUB_CACHE} (HF_HUB_CACHE, default $HF_HOME/hub)")


def hub_folder(repo_id: str, allow_patterns: list[str] | None = None, cache_only: bool = False) -> Path:
    """The snapshot folder of ``repo_id`` (its ``main`` revision) in this machine's Hugging Face
    cache, downloading what the cache lacks (``allow_patterns``: only those files) unless
    ``HF_HUB_OFFLINE`` is set or ``cache_only``. Raises a ValueError naming the id, the offline
    setting and the cache searched when the model is neither cached nor downloadable."""
    from huggingface_hub import constants, snapshot_download

    offline = cache_only or bool(constants.HF_HUB_OFFLINE)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=allow_patterns, local_files_only=offline))
    except (OSError, ValueError) as exc:
        how = "is not in the cache" if offline else "could not be downloaded and is not in the cache"
        raise ValueError(f"models[].path {repo_id}: no local model folder or .gguf file there, and the Hugging "
                         f"Face model {repo_id!r} {how} ({hub_settings()}; {type(exc).__name__}: {exc}). Download "
                         f"it on this machine first (hf download {repo_id}), with HF_HUB_OFFLINE "
                         f"unset where there is a network, or give a local folder") from None


def check_hub_id(repo_id: str) -> None:
    """At config load: with ``HF_HUB_OFFLINE`` set, ``repo_id`` must be in this machine's cache
    (a ValueError from :func:`hub_folder` otherwise). Online nothing is checked here: the run's
    start downloads the config and tokenizer files (:data:`CHECK_FILES`) before any actor starts."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        hub_folder(repo_id, CHECK_FILES, cache_only=True)


def model_folder(reference: str | Path, allow_patterns: list[str] | None = None) -> Path:
    """The local folder to load ``reference`` from: itself, or the hub snapshot of the id it names
    (:func:`hub_folder`)."""
    repo_id = hub_id(reference)
    return Path(reference) if repo_id is None else hub_folder(repo_id, allow_patterns)
