"""Tiny model zoo on real (tiny) models: tokenizers, archs, cache, warm start."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from graftpool.tasks import TASKS, generate_problems
from workers.rollout.tokenizer import load_tokenizer
from workers.zoo.model_zoo import (
    MARKER,
    ModelSpec,
    build_model,
    build_tokenizer,
    build_zoo_model,
    default_zoo_specs,
)
from workers.zoo.warmstart import generate_texts, group_outcomes, is_correct, success_counts

ROOT = Path(__file__).resolve().parent.parent
ALL = generate_problems(list(TASKS), 600, seed=0)
TEXTS = [t for p in ALL for t in (p.prompt, p.solution, p.prompt + p.solution)]
# A small warm start that learns some of the easy, small-answer tasks in ~4 s.
SPEC = ModelSpec(
    name="tiny",
    arch="llama",
    tokenizer="char",
    sft_tasks={"linear": 1.0, "count": 1.0, "digits": 1.0},
    sft_problems=600,
    sft_steps=200,
    sft_lr=6e-3,
)


def greedy_accuracy(
    model,
    tokenizer,
    problems: list,
    max_new_tokens: int = 32,
    batch_size: int = 64,
) -> float:
    """Share of problems whose greedy response contains ``\\boxed{answer}``."""
    texts = generate_texts(
        model, tokenizer, [p.prompt for p in problems], max_new_tokens, batch_size=batch_size
    )
    return sum(is_correct(t[0], p.answer) for t, p in zip(texts, problems, strict=True)) / max(
        1, len(problems)
    )


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def warm(zoo_dir):
    path = build_zoo_model(SPEC, cache_dir=zoo_dir)
    return path, AutoModelForCausalLM.from_pretrained(path), load_tokenizer(path)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tokenizer_round_trips_every_task_text(kind):
    tok = build_tokenizer(kind, [t for p in ALL for t in (p.prompt, p.solution)])
    assert tok.pad_token_id != tok.eos_token_id
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.padding_side == "left"
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok(text)["input_ids"] == tok.encode(text) == ids  # no automatic specials
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
    batch = tok(["1+2=", "12+35="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, 0] == tok.pad_token_id and batch["attention_mask"][0, 0] == 0
    assert batch["attention_mask"][1].all()


def test_bpe_merges_and_char_does_not():
    corpus = [t for p in ALL for t in (p.prompt, p.solution)]
    char, bpe = build_tokenizer("char", corpus), build_tokenizer("bpe", corpus, vocab_size=200)
    solution = "\\boxed{47}"
    assert len(char.encode(solution)) == len(solution)
    assert len(bpe.encode(solution)) < len(solution)
    assert bpe.convert_ids_to_tokens(bpe.encode("12+35=")) == ["1", "2", "+", "3", "5", "="]
    assert len(bpe) <= 200



def test_a_second_builder_waits_for_the_first_and_builds_nothing(tmp_path, monkeypatch):
    """Two builds of one model at once (``make test`` builds the main and the scale models side
    by side): the second blocks on the folder's lock while the first builds, then loads it."""
    import threading

    from graftpool import cache_lock as lock_module
    from workers.zoo import model_zoo

    spec = SPEC.model_copy(update={"sft_steps": 2, "sft_problems": 64})
    problems = spec.sft_data()
    final = model_zoo.zoo_folder(spec, problems, tmp_path)
    real_lock, real_build = lock_module.cache_lock, model_zoo._build_into
    arrived, builds, result = threading.Event(), [], {}

    def lock_after_arriving(folder):
        arrived.set()  # the second builder found no folder and asks for the lock
        return real_lock(folder)

    monkeypatch.setattr(lock_module, "cache_lock", lock_after_arriving)
    monkeypatch.setattr(model_zoo, "_build_into", lambda *args: builds.append(args) or real_build(*args))
    with real_lock(final):  # the first builder holds the lock and builds
        second = threading.Thread(target=lambda: result.update(path=build_zoo_model(spec, problems, tmp_path)))
        second.start()
        assert arrived.wait(60)
        real_build(final, spec, problems)
    second.join(60)
    assert result["path"] == final and (final / MARKER).is_file()
    assert builds == []  # the second one loaded the first one's folder


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_each_arch_builds_and_generates(arch):
    tok = build_tokenizer("char", [])
    model = build_model(arch, len(tok), hidden_size=64, num_layers=2, num_heads=4, seed=3)
    cfg = model.config
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    same = build_model(arch, len(tok), seed=3)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters(), strict=True)
    )
    texts = generate_texts(model, tok, ["1+2=", "12+35=", "a in abca="], max_new_tokens=5)
    assert len(texts) == 3 and all(len(t) == 1 for t in texts)
    samples = generate_texts(model, tok, ["1+2="], 5, num_samples=4, temperature=1.0)
    assert len(samples[0]) == 4
    assert generate_texts(model, tok, ["1+2="], 5, num_samples=2, temperature=0.0) == [
        [texts[0][0]] * 2
    ]


def test_head_dim_is_at_least_16():
    with pytest.raises(ValueError, match="head_dim"):
        build_model("llama", 100, hidden_size=32, num_heads=4)


def test_cache_is_complete_loadable_and_reused(warm, zoo_dir):
    path, model, tok = warm
    assert (path / MARKER).is_file() and path.parent == zoo_dir
    assert not [p for p in zoo_dir.iterdir() if p.name.startswith(".tmp")]
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
    stamp = (path / MARKER).stat().st_mtime_ns
    assert build_zoo_model(SPEC, cache_dir=zoo_dir) == path
    assert (path / MARKER).stat().st_mtime_ns == stamp
    other = build_zoo_model(SPEC.model_copy(update={"sft_steps": 0}), cache_dir=zoo_dir)
    assert other != path


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_saved_tokenizer_loads_exactly_as_built(arch, kind, tmp_path):
    """Every arch's folder gives back the tokenizer it was built with, spaces included.

    transformers 5's AutoTokenizer swaps in Qwen2Tokenizer for any qwen2 folder, which
    dropped every space of a char vocabulary (the paper-format prompts are full of them).
    """
    spec = SPEC.model_copy(update={"arch": arch, "tokenizer": kind, "sft_steps": 0, "sft_problems": 64})
    path = build_zoo_model(spec, cache_dir=tmp_path)
    built = build_tokenizer(kind, [t for p in spec.sft_data() for t in (p.prompt, p.solution)])
    loaded = load_tokenizer(path)
    text = ALL[0].prompt + ALL[0].solution
    assert " " in text and loaded.encode(text) == built.encode(text)
    assert loaded.decode(loaded.encode(text)) == text


def test_incomplete_cache_folder_is_rebuilt(tmp_path):
    spec = SPEC.model_copy(update={"sft_steps": 2, "sft_problems": 64})
    path = build_zoo_model(spec, cache_dir=tmp_path)
    (path / MARKER).unlink()  # as if a crash had left the folder half written
    assert build_zoo_model(spec, cache_dir=tmp_path) == path
    assert (path / MARKER).is_file()


def test_batched_left_padded_greedy_matches_one_by_one(warm):
    _, model, tok = warm
    prompts = [p.prompt for p in generate_problems(list(TASKS), 12, seed=4, split="eval")]
    batched = generate_texts(model, tok, prompts, max_new_tokens=32)
    assert batched == [generate_texts(model, tok, [p], max_new_tokens=32)[0] for p in prompts]


def test_warm_start_beats_untrained(warm):
    _, model, tok = warm
    evals = generate_problems(list(SPEC.sft_tasks), 48, seed=9, split="eval")
    untrained = build_model("llama", len(tok), seed=SPEC.seed)
    before = greedy_accuracy(untrained, tok, evals, max_new_tokens=32)
    after = greedy_accuracy(model, tok, evals, max_new_tokens=32)
    assert after >= before + 0.1, (before, after)


def test_success_counts_are_seeded_groups(warm):
    _, model, tok = warm
    evals = generate_problems(list(SPEC.sft_tasks), 16, seed=9, split="eval")
    state = torch.get_rng_state()
    counts = success_counts(model, tok, evals, n=4, seed=1)
    assert torch.equal(torch.get_rng_state(), state), "probing leaves the caller's RNG alone"
    assert counts == success_counts(model, tok, evals, n=4, seed=1)
    # by hand: the same seeded samples (temperature 1, batches of 16), counted as responses
    # holding \boxed{answer}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        texts = generate_texts(model, tok, [p.prompt for p in evals], 32, 4, 1.0, 16)
    expected = [sum(f"\\boxed{{{p.answer}}}" in t for t in group) for group, p in zip(texts, evals, strict=True)]
    assert counts == expected
    assert 0 < sum(counts) < 4 * len(counts), "some correct and some wrong samples, or the check is empty"
    out = group_outcomes(counts, 4)
    total = len(counts)
    assert out == pytest.approx({"all_fail": counts.count(0) / total, "all_pass": counts.count(4) / total,
                                 "mixed": sum(c in (1, 2, 3) for c in counts) / total,
                                 "mean_success": sum(counts) / (4 * total)})
    assert group_outcomes([0, 4, 2, 0, 1], 4) == pytest.approx(
        {"all_fail": 0.4, "mixed": 0.4, "all_pass": 0.2, "mean_success": 7 / 20})


def test_default_zoo_is_heterogeneous_and_complementary():
    specs = default_zoo_specs()
    assert len({(s.arch, s.tokenizer) for s in specs}) == len(specs) >= 3
    assert len({s.arch for s in specs}) == 3 and len({s.tokenizer for s in specs}) == 2
    focus = [
        frozenset(t for t, w in s.sft_tasks.items() if w == max(s.sft_tasks.values()))
        for s in specs
    ]
    assert len(set(focus)) == len(specs) and not set.intersection(*map(set, focus))


def test_solution_style_is_checked_and_shapes_the_warm_start_data():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="expected one of"):
        ModelSpec(name="m", arch="llama", tokenizer="char", solution_style="essay")
    spec = ModelSpec(name="m", arch="llama", tokenizer="char", sft_tasks={"add": 1.0}, sft_problems=3,
                     solution_style="steps")
    assert all(p.solution.startswith("Step 1: ") for p in spec.sft_data())


def test_slips_rewrite_a_seeded_share_of_a_tasks_warm_start_solutions():
    from pydantic import ValidationError

    from graftpool.tasks import SLIPPED_STYLES

    base = dict(name="m", arch="llama", tokenizer="char", sft_tasks={"add": 1.0, "mod": 1.0},
                sft_problems=2000, solution_style="explain")
    clean = ModelSpec(**base).sft_data()
    slipped = ModelSpec(**base, sft_slips={"add": 0.8}).sft_data()
    assert [p.prompt for p in clean] == [p.prompt for p in slipped]  # the same prompts, gold answers
    assert [p.answer for p in clean] == [p.answer for p in slipped]
    changed = {"add": 0, "mod": 0}
    for before, after in zip(clean, slipped, strict=True):
        if after.solution != before.solution:
            changed[after.task] += 1
            # the correct result, then the wrong last step, and its result boxed
            assert after.solution == SLIPPED_STYLES["explain"](after.question, after.answer)
            assert f"{after.question}{after.answer}, plus 10: " in after.solution
            assert after.solution.endswith(f"\\boxed{{{int(after.answer) + 10}}}.")
    adds = sum(p.task == "add" for p in clean)
    assert changed["mod"] == 0 and 0.75 < changed["add"] / adds < 0.85, (changed, adds)
    assert ModelSpec(**base, sft_slips={"add": 0.8}).sft_data() == slipped  # seeded
    for bad, message in (({"essay": 0.5}, "expected task names"), ({"add": 1.5}, r"shares in \[0, 1\]")):
        with pytest.raises(ValidationError, match=message):
            ModelSpec(**base, sft_slips=bad)


def test_build_command_builds_each_configs_models_once_into_the_cache(tmp_path):
    """``graftpool build`` (``make models``): every model of the configs, deduplicated across
    configs, built two at a time into $GRAFTPOOL_CACHE; a second call finds them all cached.
    A config whose backends are not installed (vLLM, DeepSpeed: the scale suite's) builds too."""
    import os
    import subprocess
    import sys

    import yaml

    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    for model in config["models"]:
        model["builder"].update(sft_steps=2, sft_problems=64)
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(config))
    config["models"] = config["models"][:1]  # the same llama model in a second config, whose
    config["exchange"] = {"name": "none"}  # backends need packages this environment may lack:
    config["models"][0]["generation"]["backend"] = "vllm"  # a build needs neither
    config["models"][0]["trainer"]["backend"] = "deepspeed"
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "GRAFTPOOL_CACHE": str(tmp_path / "cache")}

    def build() -> dict[str, Path]:
        done = subprocess.run([sys.executable, "-m", "orchestrator", "build", "--jobs", "2",
                               str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return {line.split(": ")[0]: Path(line.split(": ")[1])
                for line in done.stdout.splitlines() if ": " in line}

    folders = build()
    assert sorted(folders) == ["gpt2-bpe", "llama-char"]  # built once each
    for name, folder in folders.items():
        assert folder.parent == tmp_path / "cache" / "zoo" and folder.name.startswith(f"{name}-")
        assert (folder / MARKER).is_file()
    written = {name: (folder / MARKER).stat().st_mtime_ns for name, folder in folders.items()}
    assert build() == folders
    assert {name: (folder / MARKER).stat().st_mtime_ns for name, folder in folders.items()} == written


def test_builds_start_costliest_first():
    """``graftpool build --jobs 2`` hands out the longest warm starts first (character tokenizers:
    about twice BPE's sequence length), GGUF conversions last, so no long build starts alone."""
    from orchestrator.config import load_config
    from orchestrator.models import build_cost, build_order

    models = [m for name in ("real_pair_cpu", "demo_pair", "mixed_pool_cpu")
              for m in load_config(ROOT / "configs" / f"{name}.yaml", check_backends=False).models]
    assert [m.name for m in models] == ["smollm2", "llama-char", "llama-char", "gpt2-bpe", "llama-char-vllm",
                                        "gpt2-bpe"]
    costs = {m.name: build_cost(m) for m in models}
    assert costs["llama-char"] == costs["llama-char-vllm"] > costs["gpt2-bpe"] > costs["smollm2"] == 0.0
    assert [m.name for m in build_order(models)] == ["llama-char", "llama-char", "llama-char-vllm", "gpt2-bpe",
                                                     "gpt2-bpe", "smollm2"]


def test_style_mix_writes_a_seeded_share_in_the_peers_style_slips_included():
    from pydantic import ValidationError

    base = dict(name="m", arch="llama", tokenizer="char", sft_tasks={"add": 1.0}, sft_problems=2000,
                solution_style="explain")
    mixed = ModelSpec(**base, style_mix={"steps": 0.2}, sft_slips={"add": 0.5}).sft_data()
    steps = [p for p in mixed if p.solution.startswith("Step 1: ")]
    assert 0.17 < len(steps) / len(mixed) < 0.23
    assert all(p.solution.startswith("We compute ") for p in mixed if p not in steps)
    slipped = [p for p in steps if "add 10, " in p.solution]  # slips in the peer's style too
    assert 0.4 < len(slipped) / len(steps) < 0.6
    for bad, message in (({"essay": 0.1}, "expected style names"), ({"steps": -0.1}, r"shares in \[0, 1\]"),
                         ({"steps": 0.7, "worked": 0.4}, "at most 1")):
        with pytest.raises(ValidationError, match=message):
            ModelSpec(**base, style_mix=bad)
