"""Self-distillation for a chat model: its own greedy answers to many instructions, in shards.

Each answer is the model's greedy continuation, cut after its end-of-turn token: exactly the text
lossless (greedy) Medusa decoding has to reproduce, so exactly what the heads should learn.

Everything the heads train on is recorded *while* generating, at no extra pass: for every answer
token, the final hidden state that chose it (what the heads read at decoding time) and the base
model's top guesses at that step (the soft targets for a distillation loss). Running the base
model again over the answers would cost as much again as generating them.

Generating thousands of answers on a CPU takes an hour or more, so the work is cut into shards of
`shard_size` instructions, each written atomically as soon as it is done: a killed run resumes
where it stopped, and training can start on the shards already there. Instructions are grouped
by length before batching, so a batch pads little.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..loops import chat_prompt_ids
from ..model import padding_id, stop_token_ids
from .batches import cut_at_stop, pad_batch
from .saving import write_atomically

TEACHER_TOP_K = 32  # the base model's guesses kept per step: nearly all of its probability mass


@dataclass
class Answers:
    """One batch (or shard) of answers and what was recorded while writing them.

    Row i of the tensors belongs to answer token i, answers concatenated in order: `states[i]` is
    the final hidden state whose logits chose `tokens[i]`, and `teacher_ids/logits[i]` are the
    base model's top guesses at that step (logits in float16: only their softmax is used).
    """

    prompts: list[list[int]]
    answers: list[list[int]]
    states: torch.Tensor  # (N, hidden) float16
    tokens: torch.Tensor  # (N,) int64
    teacher_ids: torch.Tensor  # (N, TEACHER_TOP_K) int32
    teacher_logits: torch.Tensor  # (N, TEACHER_TOP_K) float16


@torch.inference_mode()
def greedy_answers(model: PreTrainedModel, prompts: Sequence[list[int]], max_new_tokens: int,
                   stop_ids: frozenset[int], pad_id: int) -> Answers:
    """The model's greedy continuation of each prompt (one batch), with what the heads learn from."""
    ids, mask = pad_batch(prompts, pad_id, side="left")
    # A bare config: nothing from the model's saved generation settings (a repetition penalty,
    # say) may bend the answers away from the plain greedy path Medusa reproduces.
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(stop_ids) or None,
                              pad_token_id=pad_id, output_hidden_states=True, output_logits=True,
                              return_dict_in_generate=True)
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    # Step s: the last layer's output at the newest position is the (normed) state the lm_head read.
    states = torch.stack([step[-1][:, -1] for step in out.hidden_states], dim=1)  # (B, steps, H)
    logits = torch.stack(out.logits, dim=1)  # (B, steps, V)
    top_logits, top_ids = logits.topk(TEACHER_TOP_K, dim=-1)
    generated = out.sequences[:, ids.shape[1]:]
    answers, rows = [], []
    for row, tokens in enumerate(generated.tolist()):
        answer = cut_at_stop(tokens, stop_ids)
        answers.append(answer)
        rows.append((row, len(answer)))
    pick = lambda t: torch.cat([t[row, :length] for row, length in rows])  # noqa: E731
    return Answers(
        prompts=list(prompts), answers=answers, states=pick(states).half(), tokens=pick(generated),
        teacher_ids=pick(top_ids).int(), teacher_logits=pick(top_logits).half(),
    )


def concat_answers(parts: list[Answers]) -> Answers:
    return Answers(
        prompts=[p for a in parts for p in a.prompts], answers=[s for a in parts for s in a.answers],
        **{name: torch.cat([getattr(a, name) for a in parts])
           for name in ("states", "tokens", "teacher_ids", "teacher_logits")},
    )


def drop_prompts(answers: Answers, prompts: set[tuple[int, ...]]) -> Answers:
    """The answers whose prompt is not in `prompts`: keeps held-out questions out of training."""
    keep = torch.tensor([tuple(p) not in prompts for p in answers.prompts])
    rows = torch.repeat_interleave(keep, torch.tensor([len(a) for a in answers.answers]))
    return Answers(
        prompts=[p for p, k in zip(answers.prompts, keep, strict=True) if k],
        answers=[a for a, k in zip(answers.answers, keep, strict=True) if k],
        **{name: getattr(answers, name)[rows] for name in ("states", "tokens", "teacher_ids", "teacher_logits")},
    )


def save_shard(answers: Answers, path: Path, instructions: Sequence[str]) -> None:
    """Write `path.safetensors` and `path.json` atomically (the JSON last: it marks a shard done)."""
    tensors = {name: getattr(answers, name).contiguous()
               for name in ("states", "tokens", "teacher_ids", "teacher_logits")}
    write_atomically(path.with_suffix(".safetensors"), lambda tmp: save_file(tensors, str(tmp)))
    meta = {"instructions": list(instructions), "prompts": answers.prompts, "answers": answers.answers}
    write_atomically(path.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(meta)))


def load_shard(path: Path) -> Answers:
    meta = json.loads(path.with_suffix(".json").read_text())
    tensors = load_file(str(path.with_suffix(".safetensors")))
    return Answers(prompts=meta["prompts"], answers=meta["answers"], **tensors)


def distill_to_shards(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    instructions: Sequence[str],
    out_dir: Path,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    shard_size: int = 64,
) -> None:
    """Answer every instruction, `shard_size` at a time; shards already on disk are skipped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stop_ids = stop_token_ids(model.generation_config)
    pad_id = padding_id(tokenizer, stop_ids)
    shards = [instructions[i : i + shard_size] for i in range(0, len(instructions), shard_size)]
    for number, shard in enumerate(tqdm(shards, desc="self-distill shards", unit="shard")):
        path = out_dir / f"shard-{number:05d}"
        if path.with_suffix(".json").exists():
            continue
        shard = sorted(shard, key=lambda text: len(chat_prompt_ids(tokenizer, text)))
        prompts = [chat_prompt_ids(tokenizer, text) for text in shard]
        parts = [greedy_answers(model, prompts[i : i + batch_size], max_new_tokens, stop_ids, pad_id)
                 for i in range(0, len(prompts), batch_size)]
        save_shard(concat_answers(parts), path, shard)


def read_shards(*out_dirs: Path) -> list[Path]:
    """Every finished shard in these folders, folder by folder, in order."""
    return [p.with_suffix("") for d in out_dirs for p in sorted(d.glob("shard-*.json"))]
