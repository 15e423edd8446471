"""Secrets never reach what the project writes (issue #17): the tracker's warnings and files
with a password in the tracking URI of a dead server, the redaction rules, the hooks that
``install`` puts on logging, warnings and tracebacks (in this process and, exactly as in
production, in a fresh interpreter), and the CLI's error output. No Ray: a few seconds.
The end-to-end paths are in tests/test_dashboards_live.py (a real MLflow server) and
tests/test_job_submit.py (``ray job submit``)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import yaml

from dashboards.tracking import Tracker
from graftpool import redaction
from graftpool.redaction import (
    install,
    redact_text,
    register_secret,
    register_secrets_in,
    without_password,
)
from orchestrator.config import ConfigError, load_config
from tests.netcut import free_port

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
SECRET = "s3cret"


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    """No secret registered by an earlier test, and every hook ``install`` wraps restored."""
    monkeypatch.setattr(redaction, "_secrets", ())
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    factory = logging.getLogRecordFactory()
    yield
    logging.setLogRecordFactory(factory)


def _files_with(folder: Path, secret: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


# -- the tracker ------------------------------------------------------------------------------


def test_dead_server_with_a_password_leaks_it_into_no_warning_and_no_file(tmp_path):
    port = free_port()  # nothing listens there
    uri = f"http://alice:{SECRET}@127.0.0.1:{port}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(uri, "graftpool", "run", {"tracking": {"uri": uri}}, ["a"], tmp_path / "run",
                          retry_after_s=0, http_timeout_s=2)
        tracker.log(1, {"train/reward_mean": 0.5}, model="a")
        tracker.finish()
    messages = [str(w.message) for w in caught]
    assert any("is unreachable" in m and f"127.0.0.1:{port}" in m for m in messages), messages
    assert any("unreachable at the end of the run" in m for m in messages), messages
    assert [m for m in messages if SECRET in m] == []
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    assert _files_with(tmp_path, SECRET) == []
    assert SECRET not in json.dumps(tracker._params) and SECRET not in tracker.shown_uri


def test_mlflow_json_keeps_user_and_host_but_not_the_password(tmp_path):
    port = free_port()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tracker = Tracker(f"http://alice:{SECRET}@127.0.0.1:{port}/mlflow", "graftpool", "run", {}, ["a"],
                          tmp_path, http_timeout_s=2)
    tracker.experiment_id, tracker.parent_id = "1", "p"
    tracker._write_pointer()  # as on a connection
    pointer = json.loads((tmp_path / "mlflow.json").read_text())
    assert pointer["tracking_uri"] == f"http://alice@127.0.0.1:{port}/mlflow"
    assert without_password("postgresql://bob:pw@db:5432/x") == "postgresql://bob@db:5432/x"
    assert without_password("sqlite:////tmp/a@b/mlflow.db") == "sqlite:////tmp/a@b/mlflow.db"


# -- the rules --------------------------------------------------------------------------------


def test_redact_text_masks_uri_userinfo_secret_assignments_and_registered_values():
    assert redact_text(f"GET http://alice:{SECRET}@mlflow:5000/api failed") == \
        "GET http://***@mlflow:5000/api failed"
    assert redact_text("https://ghp_tok3n@github.com/x") == "https://***@github.com/x"
    assert redact_text("see http://127.0.0.1:5000/#/x and bob@example.org") == \
        "see http://127.0.0.1:5000/#/x and bob@example.org"
    assert redact_text("GET /runs?token=abcd1234&page=2") == "GET /runs?token=***&page=2"
    assert redact_text("--set exchange.params.api_key=zzz999") == "--set exchange.params.api_key=***"
    assert redact_text("max_new_tokens=16 tokenizer=bpe") == "max_new_tokens=16 tokenizer=bpe"
    register_secret("p@ss word!")
    register_secret("abc")  # too short: would mask ordinary text
    register_secret("true")
    assert redact_text("pw p@ss word!") == "pw ***"
    register_secret("p%40ss%20word%21")  # a percent-encoded value is registered decoded as well
    assert redact_text("p%40ss%20word%21 / p@ss word!") == "*** / ***"
    assert redact_text("abc is true") == "abc is true"


def test_a_config_secret_is_masked_wherever_it_shows_up_again():
    config = {"exchange": {"name": "x", "params": {"api_key": "k3y-VALUE-42", "store": "runs/a"}},
              "tracking": {"uri": f"https://alice:{SECRET}@mlflow.example"},
              "models": [{"name": "m", "hf_token": "hf_abcdef"}]}
    register_secrets_in(config)
    text = f"refused: key k3y-VALUE-42 for {SECRET} (token hf_abcdef) in runs/a"
    assert redact_text(text) == "refused: key *** for *** (token ***) in runs/a"
    # load_config registers the raw config before validating it: an error may quote a value
    data = yaml.safe_load(DEMO.read_text())
    data["tracking"] = {"uri": "http://bob:0ther-pw@mlflow.example", "password": "my-pa55word"}
    with pytest.raises(ConfigError) as error:
        load_config(data=data)
    assert "my-pa55word" in str(error.value)  # the message itself quotes it ...
    assert "my-pa55word" not in redact_text(str(error.value))  # ... and every output masks it
    assert redact_text("auth failed: 0ther-pw") == "auth failed: ***"


# -- the hooks --------------------------------------------------------------------------------


def test_install_redacts_log_records_warnings_and_tracebacks_in_this_process(tmp_path):
    register_secrets_in({"exchange": {"params": {"api_key": "k3y-VALUE-42"}}})
    uri = f"http://alice:{SECRET}@127.0.0.1:9"
    install()
    factory = logging.getLogRecordFactory()
    install()  # idempotent: nothing wrapped twice
    assert logging.getLogRecordFactory() is factory

    stream = io.StringIO()
    logger = logging.getLogger("graftpool.test_redaction")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        logger.warning("uri %s, key %s", uri, "k3y-VALUE-42")
        try:
            raise RuntimeError(f"cannot reach {uri}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    logged = stream.getvalue()
    assert "uri http://***@127.0.0.1:9, key ***" in logged and "RuntimeError: cannot reach" in logged
    assert SECRET not in logged and "k3y-VALUE-42" not in logged

    with warnings.catch_warnings(record=True) as caught:  # what a test harness records
        warnings.simplefilter("always")
        install()  # catch_warnings reset showwarning: wrapped again
        warnings.warn(f"server {uri} refused key k3y-VALUE-42", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["server http://***@127.0.0.1:9 refused key ***"]
    shown = warnings.formatwarning(f"server {uri}", UserWarning, "x.py", 1)
    assert SECRET not in shown and "127.0.0.1:9" in shown
    buffer = io.StringIO()
    sys.stderr, saved = buffer, sys.stderr
    try:
        sys.excepthook(RuntimeError, RuntimeError(f"cannot reach {uri}"), None)
    finally:
        sys.stderr = saved
    assert "RuntimeError: cannot reach http://***@127.0.0.1:9" in buffer.getvalue()
    assert SECRET not in buffer.getvalue()


def test_install_in_a_fresh_interpreter_masks_stderr_of_logs_warnings_and_a_crash():
    script = textwrap.dedent(f"""
        import logging, warnings
        from graftpool.redaction import install, register_secrets_in
        register_secrets_in({{"exchange": {{"params": {{"api_key": "k3y-VALUE-42"}}}}}})
        install()
        uri = "http://alice:{SECRET}@127.0.0.1:9"
        logging.basicConfig()
        logging.getLogger("x").warning("uri %s key %s", uri, "k3y-VALUE-42")
        warnings.warn("server " + uri + " key k3y-VALUE-42")
        raise RuntimeError("crashed at " + uri + " with k3y-VALUE-42")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                            timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    for line in ("uri http://***@127.0.0.1:9 key ***", "UserWarning: server http://***@127.0.0.1:9 key ***",
                 "RuntimeError: crashed at http://***@127.0.0.1:9 with ***"):
        assert line in out, out
    assert SECRET not in out and "k3y-VALUE-42" not in out


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_config_error_prints_no_secret(tmp_path):
    data = yaml.safe_load(DEMO.read_text())
    # a password in the tracking URI, and one under a key the config does not have (its
    # error quotes the value), and a URI with a password where a name goes (quoted too)
    data["tracking"] = {"uri": f"http://alice:{SECRET}@127.0.0.1:9", "password": SECRET}
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(data))
    result = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(config),
                             "--set", f"run.name=http://bob:{SECRET}x@host"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "tracking.password: unknown key" in out and "run.name:" in out and "@host" in out, out
    assert SECRET not in out, out


def test_settings_about_a_secret_are_not_secrets():
    """``RAY_AUTH_MODE=token`` (what a ``ray job submit`` user sets, and every job's driver then
    inherits) names how Ray authenticates, not a secret: registered as one, it masked every "token"
    in the driver's output ("the ***izer has no pad ***"). A credential variable still is one. In
    a fresh process, since registered values stay for the process's life."""
    code = textwrap.dedent("""
        from graftpool.redaction import register_environment, redact_text
        register_environment({"RAY_AUTH_MODE": "token", "HF_TOKEN_PATH": "/root/.cache/huggingface/token",
                              "HF_TOKEN": "hf_abcdefgh"})
        print(redact_text("the tokenizer has no pad token; hf_abcdefgh from /root/.cache/huggingface/token"))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.stdout.strip() == "the tokenizer has no pad token; *** from /root/.cache/huggingface/token"
