"""Secret redaction: one rule for every message, warning, log line, artifact and file.

What counts as a secret:

- a value under a secret-looking key (``token``, ``password``, ``api_key``, ``hf_token``,
  ... but not ``tokenizer``, ``max_new_tokens`` or a tokenizer's special token such as
  ``models[].pad_token``: :func:`_secret_key`);
- the userinfo of a ``scheme://user:password@host`` URI (a tracking or database URI);
- every value registered with :func:`register_secret` / :func:`register_secrets_in`
  (the job's config, the tracker's URI, credential environment variables), wherever it
  shows up later: an exception's text quotes a URI in its own way (percent-encoded,
  inside a request URL), so matching the known values is what catches it.

Why here, at the bottom (standard library only): the tracker, the controller, the CLI and
the dashboards all write text; one module that each of them uses, and :func:`install`,
which routes every log record, every warning shown and every uncaught traceback through
:func:`redact_text`, make the rule the same everywhere and leave no path that skips it.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback
import warnings
from typing import Any
from urllib.parse import unquote

MASK = "***"
MIN_LENGTH = 4  # shorter values would mask ordinary text ("abc" in every path)
_NOT_SECRETS = {"true", "false", "none", "null", "yes", "no"}
_SECRET_WORDS = {"token", "secret", "password", "passwd", "apikey", "credential", "credentials", "auth"}
# a key whose last word is one of these names a setting about a secret, not the secret:
# RAY_AUTH_MODE=token (what `ray job submit` users set) would otherwise mask every "token" in the logs
_SETTING_WORDS = {"mode", "path", "file", "dir", "type", "kind"}
# "token" after one of these names a tokenizer's special token (models[].pad_token, eos_token_id): a
# word of the vocabulary that the run folder's config.yaml must keep (graftpool eval RUN_DIR loads it)
_VOCAB_WORDS = {"pad", "eos", "bos", "unk", "sep", "cls", "mask"}
_USERINFO = re.compile(r"(://)[^/@\s]*@")  # scheme://<userinfo>@host
_URI_PASSWORD = re.compile(r"://[^/@\s:]*:([^/@\s]+)@")  # scheme://user:<password>@host
_ASSIGNMENT = re.compile(r"([A-Za-z0-9_.\-]+)=([^\s&;,'\"]+)")  # key=value (query strings, --set)

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()  # registered values, longest first
_MARK = "_graftpool_redacts"


def _secret_key(key: str) -> bool:
    """``hf_token``, ``api_key``, ``password``, ... (not ``tokenizer``, ``max_new_tokens``, a setting
    about a secret such as ``ray_auth_mode`` or ``hf_token_path``, or a tokenizer's special token
    such as ``pad_token``)."""
    words = [w for w in re.split(r"[^a-z0-9]+", key.lower()) if w]
    if words and words[-1] in _SETTING_WORDS:  # ray_auth_mode, hf_token_path: settings, not secrets
        return False
    named = {w for i, w in enumerate(words) if not (w == "token" and i and words[i - 1] in _VOCAB_WORDS)}
    return bool(_SECRET_WORDS & named) or "api_key" in key.lower()


def redact(value: Any, key: str = "") -> Any:
    """A copy of a config dump fit for MLflow params and logs: values under secret-looking
    keys become ``***``, and so does the userinfo of any ``scheme://user:password@host``."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str) and value and _secret_key(key):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    return value


def register_secret(value: str | None) -> None:
    """Mask ``value`` (and its percent-decoded form) in all text from now on, in this process.
    Values shorter than 4 characters and booleans are ignored."""
    global _secrets
    found = {v for v in (value, unquote(value)) if v} if isinstance(value, str) else set()
    found = {v for v in found if len(v) >= MIN_LENGTH and v.lower() not in _NOT_SECRETS}
    if found - set(_secrets):
        with _lock:
            _secrets = tuple(sorted(set(_secrets) | found, key=len, reverse=True))


def register_secrets_in(obj: Any, key: str = "") -> None:
    """Register the secrets of a config dict (or list, or string): values under secret-looking
    keys, and the password of every ``scheme://user:password@host`` string in it."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            register_secrets_in(v, str(k))
    elif isinstance(obj, list | tuple):
        for v in obj:
            register_secrets_in(v, key)
    elif isinstance(obj, str | int) and not isinstance(obj, bool):
        text = str(obj)
        if _secret_key(key):
            register_secret(text)
        for password in _URI_PASSWORD.findall(text):
            register_secret(password)


def register_environment(environ: dict[str, str] | None = None) -> None:
    """Register the credential environment variables (``MLFLOW_TRACKING_PASSWORD``,
    ``HF_TOKEN``, ...: secret-looking names) and URI passwords in any variable."""
    register_secrets_in(dict(os.environ if environ is None else environ))


def without_password(uri: str) -> str:
    """``scheme://user:password@host/...`` -> ``scheme://user@host/...`` (a locator to keep
    in a file: the reader brings the credentials)."""
    return re.sub(r"(://[^/@\s:]*):[^/@\s]*@", r"\1@", uri)


def _assignment(match: re.Match) -> str:
    name = match.group(1).rsplit(".", 1)[-1]
    return f"{match.group(1)}={MASK}" if _secret_key(name) else match.group(0)


def redact_text(text: str) -> str:
    """``text`` with the userinfo of every URI, every ``secret_key=value`` (a query string,
    an echoed ``--set``) and every registered secret replaced by ``***``."""
    if not isinstance(text, str):
        text = str(text)
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    if "=" in text:
        text = _ASSIGNMENT.sub(_assignment, text)
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


# -- hooks -----------------------------------------------------------------------------------


def _marked(function):
    setattr(function, _MARK, True)
    return function


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: logging reports it when emitting
        return
    clean = redact_text(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        if redact_text(text) != text:
            record.exc_text = redact_text(text)
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info)


def _warning_message(message):
    clean = redact_text(str(message))
    if clean == str(message):
        return message
    if isinstance(message, Warning):
        try:
            return type(message)(clean)
        except Exception:  # noqa: BLE001 - a warning class with other arguments
            return clean
    return clean


def install() -> None:
    """Route every log record (the record factory), every warning shown (``showwarning``
    and ``formatwarning``), every uncaught exception (``sys.excepthook``, and
    ``threading.excepthook``) through :func:`redact_text`, and register the credential
    environment variables. Idempotent: a hook already wrapped is left as it is.

    A ``warnings.catch_warnings(record=True)`` block bypasses ``showwarning``: code that
    warns with a secret at hand (the tracker) redacts its own message before warning."""
    register_environment()
    factory = logging.getLogRecordFactory()
    if not getattr(factory, _MARK, False):
        def make_record(*args, **kwargs):
            record = factory(*args, **kwargs)
            _redact_record(record)
            return record
        logging.setLogRecordFactory(_marked(make_record))
    show = warnings.showwarning
    if not getattr(show, _MARK, False):
        def showwarning(message, category, filename, lineno, file=None, line=None):
            show(_warning_message(message), category, filename, lineno, file, line)
        warnings.showwarning = _marked(showwarning)
    form = warnings.formatwarning
    if not getattr(form, _MARK, False):
        def formatwarning(message, category, filename, lineno, line=None):
            return redact_text(form(message, category, filename, lineno, line))
        warnings.formatwarning = _marked(formatwarning)
    hook = sys.excepthook
    if not getattr(hook, _MARK, False):
        def excepthook(exc_type, exc, tb):
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            if redact_text(text) == text:
                hook(exc_type, exc, tb)
            else:
                sys.stderr.write(redact_text(text))
        sys.excepthook = _marked(excepthook)
    thread_hook = threading.excepthook
    if not getattr(thread_hook, _MARK, False):
        def thread_excepthook(args):
            text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
            if redact_text(text) == text:
                thread_hook(args)
            else:
                name = args.thread.name if args.thread is not None else "?"
                sys.stderr.write(f"Exception in thread {name}:\n{redact_text(text)}")
        threading.excepthook = _marked(thread_excepthook)
