"""Log-probs of the tokens ``generate`` samples, taken step by step (the ``hf`` backend).

``generate(output_logits=True)`` keeps every step's logits, in fp32, until it returns: rows x
steps x V x 4 bytes, 637 GB for 256 rows x 4,096 new tokens x 151,936 (Qwen 2.5's vocabulary)
on the GPU. :class:`StepLogprobs` hooks the model's forward during ``generate`` instead. Each
decoding forward takes as input the token sampled from the previous forward's logits, so that
token's log-prob, log softmax(z_t)[y_t], is taken then from step t's logits, the same fp32 copy
``generate`` samples from (``outputs.logits[:, -1]`` in fp32), and one step's logits are held at
a time. The last token is read from the returned sequences. The values are those of
the log-probs of ``generate``'s own kept logits (``output_logits=True``) bit for bit
(``tests/test_generation_memory.py``).

A forward hook sees every forward of the model, whichever thread runs it, so one recorder holds
the model at a time: ``generate`` calls from several threads (a served deployment's concurrent
requests, ``orchestrator/serving/serve.py``) take turns. A caller that runs other forwards of the
model around its ``generate`` (the shared prompt prefill, ``workers.rollout.generation``) holds
:func:`model_turn` across them, so that none of them reaches another thread's recorder.
"""

from __future__ import annotations

import threading
import weakref

import torch

_LOCKS: weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_turn(model: torch.nn.Module) -> threading.RLock:
    """The one lock of ``model`` (made on first use): ``with model_turn(model):`` runs forwards of
    it while no other thread does; re-entrant, so a :class:`StepLogprobs` inside takes it again."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(model, threading.RLock())


def _token_logprob(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per row: [rows, V] fp32 and [rows] ids -> [rows]."""
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]


class StepLogprobs:
    """``with StepLogprobs(model) as steps: out = model.generate(...)``, then
    ``steps.logprobs(new_tokens)``: [rows, steps] in fp32. The first forward is the prefill
    (its last position's logits are step 0's), each later one decodes the token sampled before it."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.last: torch.Tensor | None = None  # the latest forward's next-token logits, fp32 [rows, V]
        self.taken: list[torch.Tensor] = []  # log-probs of the tokens sampled so far but the latest, [rows] each

    def __enter__(self) -> StepLogprobs:
        self._lock = model_turn(self.model)
        self._lock.acquire()  # another thread's generate on this model waits: its forwards would reach this hook
        self._handle = self.model.register_forward_hook(self._record, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()
        self._lock.release()

    def _record(self, module, args, kwargs, output) -> None:
        if self.last is not None:  # this forward's input ends with the token sampled from ``last``
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            self.taken.append(_token_logprob(self.last, ids[:, -1].to(self.last.device)))
        self.last = output.logits[:, -1].to(dtype=torch.float32, copy=True)

    def logprobs(self, tokens: torch.Tensor) -> torch.Tensor:
        """The log-probs of ``tokens`` (the sequences' new tokens, [rows, steps]), [rows, steps]."""
        steps = tokens.shape[1]
        if steps == 0:
            return torch.zeros(tokens.shape)
        taken = self.taken[:steps]
        if len(taken) < steps:
            taken.append(_token_logprob(self.last, tokens[:, len(taken)].to(self.last.device)))
        if len(taken) != steps:
            raise RuntimeError(f"generate ran {len(self.taken) + 1} forward passes for {steps} new tokens")
        return torch.stack(taken, dim=1)
