"""``graftpool serve RUN_DIR [--port P]``: a run's final models behind one OpenAI-compatible
endpoint, with Ray Serve.

One deployment per model of the run (``ModelServer``: the ``hf`` backend on CPU, ``vllm`` where
a GPU and vLLM are there, with the GPU defaults of the run's replicas: :func:`serving_settings`;
on a Ray instance with GPUs each deployment asks for one GPU, or 1/k of one where k =
ceil(models / GPUs): :func:`gpus_per_model`), and one ingress (``OpenAIRouter``, FastAPI) that
answers ``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions`` and routes
each request to the deployment named by its ``model`` field (404, OpenAI's error shape, for
any other name). Completions take the prompt as given; chat messages are rendered with the
model's chat template when its tokenizer has one (what training did, ``workers.rollout.chat``), else
the last user message is the prompt (the zoo models were trained on plain prompts). The HTTP
proxy listens on 127.0.0.1 only.
"""


import math
import time
import uuid
from pathlib import Path

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from orchestrator.config import ConfigError
from orchestrator.serving.context_length import EMPTY_PROMPT, context_tokens, fit_length
from orchestrator.serving.openai_wire import (
    UNSUPPORTED,
    answer_as_requested,
    error_response,
    request_error,
    served_fields,
    text_messages,
    usage_of,
)
from workers.model_files import ModelSource
from workers.rollout.settings import GenerationSettings, VLLMSettings

LOOPBACK = "127.0.0.1"
APP_NAME = "graftpool"
api = FastAPI(title="GraftPool models")


def final_models(run_dir: Path) -> dict[str, tuple[Path, str]]:
    """name -> (final weights folder, absolute, chat_template mode) of every model of a run folder."""
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{run_dir} is not a run folder: no config.yaml")
    models = {}
    for model in yaml.safe_load(config_file.read_text())["models"]:
        folder = run_dir.resolve() / "final" / model["name"]
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{run_dir}: no final weights for model {model['name']} at {folder}")
        models[model["name"]] = (folder, model.get("chat_template", "auto"))
    return models


def run_max_new_tokens(run_dir: Path) -> dict[str, int]:
    """name -> ``models[].generation.max_new_tokens`` of the run (what its answers were trained at;
    the config's default where the file has none): the chat route's default answer length."""
    from orchestrator.config.models_section import GenerationConfig

    default = GenerationConfig.model_fields["max_new_tokens"].default
    return {model["name"]: int((model.get("generation") or {}).get("max_new_tokens") or default)
            for model in yaml.safe_load((run_dir / "config.yaml").read_text())["models"]}


def run_model_loading(run_dir: Path) -> dict[str, dict]:
    """name -> how the run loaded the model (``models[].trust_remote_code``, ``pad_token``,
    ``generation.vllm.max_model_len`` and ``dtype``), as its replicas did: a final folder of a model with
    code of its own (``auto_map``) loads only with the run's ``trust_remote_code``, which ``graftpool
    eval`` took from the config and serve did not; a vLLM engine without the run's ``max_model_len``
    takes the model's whole context (131,072 tokens for Llama 3.2), whose KV cache for one row (14 GiB
    at 3 B) does not fit the share of a 24 or 48 GB GPU that two models share, so the engine refused to
    start; and one without its ``dtype`` (``float16`` on a GPU without bf16, as a V100) took bf16."""
    out = {}
    for model in yaml.safe_load((run_dir / "config.yaml").read_text())["models"]:
        vllm = (model.get("generation") or {}).get("vllm") or {}
        out[model["name"]] = {"trust_remote_code": bool(model.get("trust_remote_code", False)),
                              "pad_token": model.get("pad_token"), "max_model_len": vllm.get("max_model_len"),
                              "vllm_dtype": vllm.get("dtype") or "auto"}
    return out


@serve.deployment
class ModelServer:
    """One model: renders chat messages, samples with the generation backend."""

    def __init__(self, name: str, path: str | ModelSource, chat_template: str = "auto", backend: str | None = None,
                 num_gpus: float = 0.0, trust_remote_code: bool = False, pad_token: str | None = None,
                 max_model_len: int | None = None, vllm_dtype: str = "auto"):
        import torch

        from workers.model_files import local_model
        from workers.rollout.chat import stop_token_ids
        from workers.rollout.generation import make_backend
        from workers.rollout.tokenizer import load_tokenizer

        path = local_model(path)  # the run's folder, or this node's copy of it (no shared disk)
        self.name = name
        self.tokenizer = load_tokenizer(path, trust_remote_code, pad_token)
        self.chat_template = chat_template
        # prompts arrive rendered (completions: as the client sent them; chat: below), so the backend
        # renders none; a response still ends where the run's ended it: at the turn end of the chat
        # template the model was trained under too (a base model's files name only its end of text)
        self.stops = tuple(stop_token_ids(self.tokenizer, None, chat_template))
        on_gpu = num_gpus > 0 and torch.cuda.is_available()
        self.backend = make_backend(serving_settings(path, num_gpus if on_gpu else 0.0, _has_vllm(), backend,
                                                     trust_remote_code=trust_remote_code, pad_token=pad_token,
                                                     max_model_len=max_model_len, vllm_dtype=vllm_dtype))
        self.context = context_tokens(self.backend)

    def length_for(self, prompts: list[str], max_tokens: int, asked: bool) -> int | str:
        """The response length to sample ``prompts`` at within the model's context, or why not
        (:meth:`_fit` over the prompts' token counts)."""
        return self._fit([len(self.tokenizer(p)["input_ids"]) for p in prompts], max_tokens, asked)

    def _fit(self, prompt_tokens: list[int], max_tokens: int, asked: bool) -> int | str:
        """``context_length.fit_length`` with P the longest prompt's tokens; a prompt of no tokens
        cannot be sampled from (vLLM's server: "The decoder prompt cannot be empty")."""
        if min(prompt_tokens) == 0:
            return EMPTY_PROMPT
        return fit_length(self.context, max(prompt_tokens), max_tokens, asked)

    def render(self, messages: list[dict]) -> str:
        """The chat as the backend takes it: rendered as training rendered it, its ids the
        training's (a template's BOS not doubled by the tokenizer's, ``without_template_bos``)."""
        from workers.rollout.chat import render_messages, without_template_bos

        if self.chat_template != "none" and getattr(self.tokenizer, "chat_template", None):
            rendered = render_messages(self.tokenizer, messages)  # the date line as training's (TEMPLATE_VARIABLES)
            return without_template_bos(self.tokenizer, rendered)
        users = [m.get("content", "") for m in messages if m.get("role") == "user"]
        return users[-1] if users else ""

    def complete(self, prompts: list[str], n: int, temperature: float, top_p: float, max_tokens: int,
                 stop: tuple[str, ...] = (), asked: bool = True) -> list[dict] | str:
        """Per prompt: its n sampled texts, whether each stopped (on an end token or a ``stop``
        string), token counts. A text is cut before the first ``stop`` string it holds, as
        OpenAI and vLLM cut it, and counts the tokens up to the one that completed it. The length is
        first fitted to the model's context (:meth:`_fit`; ``asked``: the request set it): where it
        cannot be, why not, which the router answers with a 400."""
        from workers.rollout.generation import SamplingParams

        prompt_tokens = [len(self.tokenizer(p)["input_ids"]) for p in prompts]
        length = self._fit(prompt_tokens, max_tokens, asked)
        if isinstance(length, str):
            return length
        completions = self.backend.generate(prompts, SamplingParams(n, temperature, top_p, length, self.stops))
        out = []
        for c, tokens in zip(completions, prompt_tokens, strict=True):
            cut = [self._cut(text, ids, done, stop) for text, ids, done in zip(c.responses, c.token_ids, c.finished,
                                                                             strict=True)]
            out.append({"texts": [t for t, _, _ in cut], "finished": [d for _, d, _ in cut],
                        "tokens": [k for _, _, k in cut], "prompt_tokens": tokens})
        return out

    def _cut(self, text: str, ids: list[int], done: bool, stop: tuple[str, ...]) -> tuple[str, bool, int]:
        """(text, finished, tokens) with ``text`` cut before its first ``stop`` string: the fewest
        tokens whose decoding holds one (a binary search; a longer prefix holds it too)."""
        def first(decoded: str) -> int:
            return min((i for i in (decoded.find(s) for s in stop) if i >= 0), default=-1)

        if not stop or first(text) < 0:
            return text, done, len(ids)
        low, high = 1, len(ids)
        while low < high:
            mid = (low + high) // 2
            if first(self.tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= 0:
                high = mid
            else:
                low = mid + 1
        return text[:first(text)], True, low


def serving_settings(path: str | ModelSource, num_gpus: float, vllm_installed: bool, backend: str | None = None,
                     trust_remote_code: bool = False, pad_token: str | None = None,
                     max_model_len: int | None = None, vllm_dtype: str = "auto") -> GenerationSettings:
    """A served model's generation settings on ``num_gpus`` of a GPU (0: the CPU). On a GPU: ``vllm``
    when installed (else ``hf``) with the run's replicas' GPU defaults (``VLLMSettings.resolved``:
    0.9 x min(num_gpus, 1) of the GPU's memory, CUDA graphs), ``hf`` on ``cuda`` in bfloat16; on
    CPU: ``hf`` in float32 (vLLM's CPU defaults where ``backend`` says vllm). ``trust_remote_code``,
    ``pad_token``, vLLM's ``max_model_len`` (None: the model's own) and ``vllm_dtype``: the run's
    (:func:`run_model_loading`)."""
    backend = backend or ("vllm" if num_gpus > 0 and vllm_installed else "hf")
    return GenerationSettings(backend=backend, path=path, chat_template="none", seed=0,
                              trust_remote_code=trust_remote_code, pad_token=pad_token,
                              device="cuda" if num_gpus > 0 else "cpu", gpu_share=min(num_gpus, 1.0),
                              vllm=VLLMSettings(max_model_len=max_model_len, dtype=vllm_dtype).resolved(num_gpus))


def gpus_per_model(cluster_gpus: float, models: int) -> float:
    """What each model's deployment asks of a GPU: one each where there are enough, else 1/k of one
    with k = ceil(models / GPUs), the fewest deployments a GPU that holds them all (vLLM's memory share
    follows it, :func:`serving_settings`); 0 without GPUs. Ray places a fractional GPU request
    within one GPU, so GPUs / models (0.8 each for 5 models on 4 GPUs, 2/3 for 3 on 2) left a
    deployment that fitted on no GPU pending, and ``serve.run`` waited for it for ever."""
    if cluster_gpus <= 0:
        return 0.0
    return 1.0 / math.ceil(models / max(math.floor(cluster_gpus), 1))


def gpu_bundles(run_dir: Path, cluster_gpus: float) -> tuple[list[dict[str, float]], float]:
    """What to ask a cluster for before deploying, and how long to wait (the run's
    ``ray.wait_for_resources_s``): where it has no GPU now but the run's replicas ran on GPUs
    (``models[].generation.num_gpus`` > 0), its GPU workers were taken down by the autoscaler after
    the job (``cluster.yaml``: ``min_workers: 0``), and each model asks for
    ``{CPU: 1, GPU: min(1, num_gpus)}`` (a deployment's CPU and its GPU share); else nothing."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    gpus = [float((m.get("generation") or {}).get("num_gpus") or 0) for m in config["models"]]
    wait_s = float((config.get("ray") or {}).get("wait_for_resources_s", 600.0))
    if cluster_gpus > 0 or not any(gpus):
        return [], wait_s
    return [{"CPU": 1.0, "GPU": min(1.0, g)} for g in gpus if g > 0], wait_s


def serving_ray_init_kwargs(environ: dict[str, str]) -> dict:
    """``ray.init`` arguments: the cluster named by ``RAY_ADDRESS`` (set in a ``ray job submit``
    job, or by the user on a cluster's head), else a new local instance bound to 127.0.0.1."""
    from orchestrator.cluster.local_ray import local_ray_init_kwargs

    address = environ.get("RAY_ADDRESS")
    return {"address": address} if address else local_ray_init_kwargs()


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@serve.deployment
@serve.ingress(api)
class OpenAIRouter:
    """The OpenAI-compatible routes; ``servers`` are the models' deployment handles, in the order
    of ``names``."""

    def __init__(self, names: list[str], *servers, chat_max_tokens: dict[str, int] | None = None):
        self.servers = dict(zip(names, servers, strict=True))
        self.chat_max_tokens = chat_max_tokens or {}  # name -> the run's max_new_tokens (chat's default)

    def _not_found(self, body: dict) -> JSONResponse:
        return error_response(404, f"model {body.get('model')!r} is not served; try one of {sorted(self.servers)}",
                      "model_not_found")

    @staticmethod
    def _answer_error(result: list[dict] | str) -> JSONResponse | None:
        """A 400 where ``ModelServer.complete`` could not fit the request's length to the model's
        context, or found a prompt empty; None where it sampled."""
        if not isinstance(result, str):
            return None
        return error_response(400, result, "invalid_request" if result == EMPTY_PROMPT else "context_length_exceeded")

    @staticmethod
    def _asked(body: dict, chat: bool) -> bool:
        """Whether the request set its length (else the route's default, which is cut to the context)."""
        return bool(body.get("max_tokens") or (chat and body.get("max_completion_tokens")))

    def _sampling(self, body: dict, chat: bool = False) -> dict:
        """The request's sampling. Its length: ``max_tokens``; a chat request's also
        ``max_completion_tokens`` (OpenAI's newer name, which current clients send), and without
        either the run's ``max_new_tokens`` for that model (OpenAI and vLLM bound a chat answer by
        the context, not by the completions route's default of 16 tokens)."""
        limit = body.get("max_completion_tokens") if chat else None
        limit = limit or body.get("max_tokens") or (self.chat_max_tokens.get(body.get("model"), 16) if chat else 16)
        stop = body.get("stop") or ()
        temperature, top_p = body.get("temperature"), body.get("top_p")  # null: the default, as OpenAI takes it
        return {"n": int(body.get("n") or 1), "temperature": 1.0 if temperature is None else float(temperature),
                "top_p": 1.0 if top_p is None else float(top_p), "max_tokens": int(limit),
                "stop": tuple(s for s in ((stop,) if isinstance(stop, str) else stop) if s)}  # "" stops nothing

    @staticmethod
    def _unsupported(body: dict, chat: bool) -> JSONResponse | None:
        """A 400 naming a request field the backends do not honour, set to other than its default
        (:data:`UNSUPPORTED`), or not served by this route (not in ``served_fields(chat)``), rather
        than an answer that silently ignores it."""
        asked = [k for k, default in UNSUPPORTED.items() if body.get(k) not in default]
        asked += sorted(k for k in body if k not in served_fields(chat) and k not in UNSUPPORTED)
        if not asked:
            return None
        own = "messages, max_completion_tokens / max_tokens" if chat else "prompt, max_tokens"
        return error_response(400, f"graftpool serve does not support {', '.join(asked)} here (supported: model, {own}, "
                           "n, temperature, top_p, stop, stream, stream_options)", "unsupported_parameter")

    async def _request(self, request: Request, chat: bool) -> tuple[dict | JSONResponse, object | None]:
        """The request's body and its model's deployment, or the error response (OpenAI's shape): a
        body that is not JSON or malformed (:func:`request_error`) is a 400, an unknown model a 404, a
        field not served a 400."""
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the request body is not JSON", "invalid_request"), None
        if (problem := request_error(body, chat)) is not None:
            return error_response(400, problem, "invalid_request"), None
        server = self.servers.get(body.get("model"))
        if server is None:
            return self._not_found(body), None
        if (refused := self._unsupported(body, chat)) is not None:
            return refused, None
        return body, server

    @api.get("/v1/models")
    def models(self) -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "graftpool"}
                                           for name in self.servers]}

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        body, server = await self._request(request, chat=False)
        if server is None:
            return body
        prompts = body["prompt"]
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not all(isinstance(p, str) for p in prompts):  # token ids: the backends take text
            return error_response(400, "graftpool serve takes a prompt as text (a string or a list of strings), "
                               "not token ids", "unsupported_prompt")
        results = await server.complete.remote(prompts, **self._sampling(body), asked=self._asked(body, False))
        if (refused := self._answer_error(results)) is not None:
            return refused
        choices = [{"index": i * len(r["texts"]) + j, "text": text, "logprobs": None,
                    "finish_reason": "stop" if done else "length"}
                   for i, r in enumerate(results) for j, (text, done) in enumerate(zip(r["texts"], r["finished"],
                                                                                        strict=True))]
        return answer_as_requested({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                        "model": body["model"], "choices": choices, "usage": usage_of(results)}, "text_completion", body)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        body, server = await self._request(request, chat=True)
        if server is None:
            return body
        messages = text_messages(body["messages"])
        if isinstance(messages, JSONResponse):
            return messages
        prompt = await server.render.remote(messages)
        results = await server.complete.remote([prompt], **self._sampling(body, chat=True), asked=self._asked(body, True))
        if (refused := self._answer_error(results)) is not None:
            return refused
        choices = [{"index": j, "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop" if done else "length"}
                   for j, (text, done) in enumerate(zip(results[0]["texts"], results[0]["finished"], strict=True))]
        return answer_as_requested({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                        "model": body["model"], "choices": choices, "usage": usage_of(results)},
                       "chat.completion.chunk", body)


def build_app(models: dict[str, tuple[Path, str]], chat_max_tokens: dict[str, int] | None = None,
              loading: dict[str, dict] | None = None):
    """The ingress bound to one deployment per model (:func:`final_models`), each loaded as the run
    loaded it (``loading``: :func:`run_model_loading`); a model's folder is shipped to the nodes of
    the cluster that do not see it (``orchestrator.cluster.model_shipping``)."""
    import ray

    from orchestrator.cluster.model_shipping import ModelShipment

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]  # where Serve may place a replica
    gpus = gpus_per_model(ray.cluster_resources().get("GPU", 0.0), len(models))
    servers = [ModelServer.options(name=f"model-{name}", ray_actor_options={"num_gpus": gpus})
               .bind(name, ModelShipment(path).source_for(nodes), template, None, gpus, **(loading or {}).get(name, {}))
               for name, (path, template) in models.items()]
    return OpenAIRouter.bind(list(models), *servers, chat_max_tokens=chat_max_tokens)


def start_serving(run_dir: Path, port: int = 8000) -> str:
    """Deploy the run's models on the current Ray instance, else the cluster at ``RAY_ADDRESS``,
    else a local one on 127.0.0.1, and return the endpoint's base URL (``http://127.0.0.1:PORT/v1``).
    On a cluster without a GPU now, a run trained on GPUs first waits for the autoscaler to add
    them (:func:`gpu_bundles`), as a training job does."""
    import os

    import ray

    from orchestrator.cluster.autoscale import wait_for_bundles

    models = final_models(Path(run_dir))  # a bad folder fails before Ray starts
    local = False
    if not ray.is_initialized():
        kwargs = serving_ray_init_kwargs(dict(os.environ))
        local = kwargs.get("address") == "local"
        ray.init(**kwargs, **({"num_cpus": max(4, 2 * len(models))} if local else {}))
    bundles, wait_s = gpu_bundles(Path(run_dir), ray.cluster_resources().get("GPU", 0.0))
    if bundles and not local:  # a cluster: its autoscaler adds the GPU nodes, to which build_app ships
        try:
            wait_for_bundles(bundles, wait_s)
        except RuntimeError as exc:
            raise RuntimeError(f"graftpool serve: the run's replicas ran on GPUs (models[].generation.num_gpus) and "
                               f"the cluster has none now; {exc}. To serve on this machine's CPUs instead, unset "
                               "RAY_ADDRESS") from None
    serve.start(http_options={"host": LOOPBACK, "port": port})
    if APP_NAME in serve.status().applications:  # one Serve, one HTTP port a cluster: run would replace it
        raise RuntimeError(f"graftpool serve: this Ray cluster already serves an application {APP_NAME!r} (another "
                           f"graftpool serve, whose models this would replace; port {port} would be ignored): stop it "
                           "first (Ctrl-C, `ray job stop`; `serve shutdown -y` where its process is gone)")
    serve.run(build_app(models, run_max_new_tokens(Path(run_dir)), run_model_loading(Path(run_dir))), name=APP_NAME,
              route_prefix="/")
    return f"http://{LOOPBACK}:{port}/v1"
