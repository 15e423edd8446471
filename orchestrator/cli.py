"""``python -m orchestrator`` / ``graftpool``: run a job, evaluate a run folder, run the demo."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from graftpool.redaction import install, redact_text
from orchestrator.config import ConfigError, load_config
from orchestrator.config.final_models import final_models_config


def _print_summary(summary: dict) -> None:
    """The job's last lines. The run folder is named absolute: under ``ray job submit`` a relative
    ``run.output_dir`` is in the job's uploaded working copy on the head (a temporary folder of
    Ray's), which a relative path would not locate (for ``ray rsync-down``, ``serve``, ``eval``)."""
    print(f"\nrun {summary['run']}: {summary['steps']} steps, folder {Path(summary['run_dir']).resolve()}")
    for name, model in summary["models"].items():
        final = model["final_pass@1"]
        ex = model["exchange"]
        rate = ex["received"] / ex["all_fail"] if ex["all_fail"] else 0.0
        scores = "  ".join(f"{k}={v:.3f}" for k, v in final.items())
        print(f"  {name:<14} pass@1 {scores or '-'} | all-fail {ex['all_fail'] / max(ex['prompts'], 1):.2f}"
              f" | exchange rate {rate:.2f} (received {ex['received']}, given {ex['given']})")
    phases = "  ".join(f"{p} {t:.2f}s" for p, t in summary["mean_step_time"].items())
    print(f"  mean step {summary['mean_step_total']:.2f}s: {phases}")


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.controller.loop import train

    config = load_config(args.config, [*args.set, *(["run.resume=true"] if args.resume else [])])
    summary = train(config)
    _print_summary(summary)
    return 0


def evaluate_run(run_dir: Path, overrides: list[str] | None = None) -> dict[str, dict[str, float]]:
    """pass@1 of a finished run's final models on its eval sets (``graftpool eval RUN_DIR``):
    ``eval.json`` and every scored response in ``eval.parquet``."""
    from orchestrator.controller.loop import Controller

    config = final_models_config(run_dir, overrides)
    controller = Controller(config)
    status = "FAILED"
    try:
        controller.start(train=False)
        if not controller.eval_sets:
            raise ConfigError("data.eval: the run has no eval sets")
        scores = controller.evaluate(step=config.run.steps, responses=run_dir / "eval.parquet")
        (run_dir / "eval.json").write_text(json.dumps(scores, indent=2))
        status = "FINISHED"
        return scores
    finally:
        controller.close(status)


def cmd_eval(args: argparse.Namespace) -> int:
    if args.endpoint:
        from orchestrator.serving.endpoint_eval import evaluate_endpoint

        scores = evaluate_endpoint(Path(args.run_dir), args.endpoint, args.set)
    else:
        scores = evaluate_run(Path(args.run_dir), args.set)
    print(json.dumps(scores, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from orchestrator.serving.serve_process import serve_forever

    return serve_forever(Path(args.run_dir), args.port)


def cmd_build(args: argparse.Namespace) -> int:
    """Build (zoo) or convert (GGUF) every model of the configs into the cache, ``--jobs`` at a
    time, so that runs, tests and jobs that use them start at once. A config's generation and
    trainer backends need not be installed here: a vLLM config's models build in any
    environment (``make models`` builds the scale suite's beside the main suite's)."""
    from orchestrator.models import build_models

    configs = [load_config(path, check_backends=False) for path in args.configs]
    build_models([m for config in configs for m in config.models], args.jobs,
                 report=lambda line: print(line, flush=True))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestrator.demos.demo import run_demo

    return run_demo(steps=args.steps)


def cmd_real_demo(args: argparse.Namespace) -> int:
    from orchestrator.demos.real_demo import run_real_demo

    return run_real_demo(steps=args.steps)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graftpool", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the models of a config with its exchange policy")
    run.add_argument("config", help="YAML config file")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config field, e.g. --set run.steps=20 (repeatable)")
    run.add_argument("--resume", action="store_true",
                     help="continue from the run folder's latest complete checkpoint (start afresh "
                          "when there is none), as run.resume=true: safe to re-submit")
    run.set_defaults(func=cmd_run)
    ev = sub.add_parser("eval", help="evaluate the final models of a run folder on its eval sets")
    ev.add_argument("run_dir")
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ev.add_argument("--endpoint", default=None, metavar="URL",
                    help="score through an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1 "
                         "of `graftpool serve`) instead of loading the final weights")
    ev.set_defaults(func=cmd_eval)
    srv = sub.add_parser("serve", help="serve a run's final models (OpenAI-compatible, Ray Serve, 127.0.0.1)")
    srv.add_argument("run_dir")
    srv.add_argument("--port", type=int, default=8000)
    srv.set_defaults(func=cmd_serve)
    build = sub.add_parser("build", help="build or convert the configs' models into the cache ahead of runs")
    build.add_argument("configs", nargs="+", help="YAML config files")
    build.add_argument("--jobs", type=int, default=1, help="models built at a time (each on one core)")
    build.set_defaults(func=cmd_build)
    demo = sub.add_parser("demo", help="the embedded demo: GRPO vs GRAFT on a tiny pair, on CPU")
    demo.add_argument("--steps", type=int, default=None)
    demo.set_defaults(func=cmd_demo)
    real = sub.add_parser("real-demo", help="SmolLM2-135M-Instruct (packaged GGUF) and a zoo model through GRAFT")
    real.add_argument("--steps", type=int, default=None)
    real.set_defaults(func=cmd_real_demo)
    return parser


def working_dir_on_path() -> None:
    """The working directory first on the import path, as ``python -m orchestrator`` has it: the
    ``graftpool`` console script's ``sys.path[0]`` is its own ``bin`` folder, so a module of the
    working directory (a reward plugin ``python:my_rewards:score``, a registry's ``lazy`` entry)
    passed under ``python -m`` and was refused at load, or not found in the driver once the
    actors had started (which import it: Ray puts the driver's working directory on their path)."""
    here = str(Path.cwd())
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def main(argv: list[str] | None = None) -> int:
    """Every message of the command goes through ``graftpool.redaction`` (the config's secrets
    are registered when it is loaded; log lines, warnings and tracebacks by :func:`install`)."""
    working_dir_on_path()
    install()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(redact_text(f"error: {exc}"), file=sys.stderr)
        return 2
    except RuntimeError as exc:
        if type(exc).__name__ != "ActorLost":  # orchestrator.controller.faults (not imported here: no Ray)
            raise
        print(redact_text(f"error: {exc}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
