"""How often a draft model's next-token guess is its target's: what predicts a draft chain's acceptance.

    python -m scripts.draft_agreement --target assets/models/austen --draft assets/models/austen/draft --corpus austen
    python -m scripts.draft_agreement --target ~/.cache/medusa-playground/models/smollm2 \\
        --draft assets/models/smollm2/draft --corpus runs/smollm2/distill,runs/smollm2/distill-b

Both models run over the same held-out token sequences, the split `train-base` held out of the
same `--corpus` (so the draft never trained on them), and at every position the two argmaxes are
compared ("top-1 agreement"). Two kinds of sequence:

* held-out *text* ('austen', 'stdlib', .txt): non-overlapping `--seq-len` windows of the held-out
  split, every position counted; and the target's own greedy continuations of `--continuations`
  prompts cut from it (`--prompt-tokens` each, `--new-tokens` generated), only generated positions
  counted. The continuations are what speculative decoding meets: its context is always the
  target's own output.
* held-out self-distill *records* (a chat model's greedy answers): the answer positions only.

On greedy sequences (continuations, records) it also plays greedy speculative decoding with a
chain of k drafted tokens: each round accepts the drafts up to the first disagreement, plus the
target's own token, so "tokens per target pass" is exact for these sequences (drafting cost aside).
It also reports both models' cross-entropy on the held-out windows or answers (fp32, no autocast),
and what one cached one-token step of each costs here (`generate`, median of a few alternating
runs): a draft must be much cheaper than its target for agreement to turn into speed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from decoding.training.base_tokens import encode_documents, special_ids, token_stream
from decoding.training.corpus import DEFAULT_HELDOUT_FRACTION, build_corpus, record_folders, split_records

CHAINS = (1, 2, 4, 8)


@dataclass
class Tally:
    """Agreement counts and losses over some positions, and the greedy sequences' agreement runs."""

    positions: int = 0
    agreed: int = 0
    target_nll: float = 0.0  # summed cross-entropy against the sequence's next tokens
    draft_nll: float = 0.0
    sequences: list[list[bool]] = field(default_factory=list)  # per greedy sequence: agreed or not

    def add(self, target_logits: torch.Tensor, draft_logits: torch.Tensor, labels: torch.Tensor,
            greedy: bool) -> None:
        """Logits (T, V) predicting `labels` (T,) at the positions to count."""
        agree = target_logits.argmax(-1) == draft_logits.argmax(-1)
        self.positions += len(labels)
        self.agreed += int(agree.sum())
        self.target_nll += float(F.cross_entropy(target_logits.float(), labels, reduction="sum"))
        self.draft_nll += float(F.cross_entropy(draft_logits.float(), labels, reduction="sum"))
        if greedy:
            self.sequences.append(agree.tolist())

    def tokens_per_pass(self, chain: int) -> float:
        """Greedy speculative decoding with `chain` drafted tokens a round, replayed on the sequences:
        tokens per target (verify) pass."""
        tokens = passes = 0
        for agree in self.sequences:
            pos = 0
            while pos < len(agree):
                run = 0
                while run < chain and pos + run < len(agree) and agree[pos + run]:
                    run += 1
                step = min(run + 1, len(agree) - pos)  # the accepted drafts, and the target's token
                tokens, passes, pos = tokens + step, passes + 1, pos + step
        return tokens / passes if passes else math.nan

    def summary(self) -> dict[str, float | int]:
        result: dict[str, float | int] = {
            "positions": self.positions,
            "top1_agreement": round(self.agreed / self.positions, 4) if self.positions else math.nan,
            "target_loss": round(self.target_nll / self.positions, 4) if self.positions else math.nan,
            "draft_loss": round(self.draft_nll / self.positions, 4) if self.positions else math.nan,
        }
        if self.sequences:
            result["sequences"] = len(self.sequences)
            for chain in CHAINS:
                result[f"tokens_per_pass_chain{chain}"] = round(self.tokens_per_pass(chain), 3)
        return result


@torch.inference_mode()
def logits_of(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """(T, V) float32 logits of one unpadded sequence."""
    return model(input_ids=torch.tensor([ids])).logits[0].float()


def step_ms(models: dict[str, PreTrainedModel], prompt: list[int], tokens: int, rounds: int = 3) -> dict[str, float]:
    """Milliseconds per token of cached greedy `generate` for each model, alternating, median of `rounds`."""
    ids = torch.tensor([prompt])
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                               do_sample=False, pad_token_id=model.config.eos_token_id, eos_token_id=None)
            times[name].append((time.perf_counter() - start) * 1000 / tokens)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def check_pair(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    """A draft must share its target's vocabulary and special tokens."""
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"):
        mine, theirs = getattr(draft.config, key), getattr(target.config, key)
        if mine != theirs:
            raise SystemExit(f"the draft's {key} is {mine}, its target's {theirs}")


def measure_text(target: PreTrainedModel, draft: PreTrainedModel, tokenizer, source: str,
                 args: argparse.Namespace) -> dict[str, dict]:
    """Held-out windows of a text corpus, and the target's greedy continuations of prompts from it."""
    _, heldout_text = build_corpus(source)
    docs = encode_documents(tokenizer, heldout_text)
    stream = token_stream(docs)
    windows = stream[: len(stream) // args.seq_len * args.seq_len].view(-1, args.seq_len)[: args.max_windows]
    text = Tally()
    for window in windows.tolist():
        text.add(logits_of(target, window)[:-1], logits_of(draft, window)[:-1], torch.tensor(window[1:]), greedy=False)

    continuations = Tally()
    eos = special_ids(tokenizer)[1]
    step = max(1, len(stream) // max(1, args.continuations))
    starts = list(range(0, len(stream) - args.prompt_tokens, step))[: args.continuations]
    for start in starts:
        prompt = stream[start : start + args.prompt_tokens].view(1, -1)
        with torch.inference_mode():
            out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
                                  min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=eos,
                                  eos_token_id=None)
        ids = out[0].tolist()
        first = args.prompt_tokens - 1  # the position whose logits chose the first new token
        continuations.add(logits_of(target, ids)[first:-1], logits_of(draft, ids)[first:-1],
                          torch.tensor(ids[first + 1 :]), greedy=True)
    return {"heldout_windows": text.summary(), "greedy_continuations": continuations.summary()}


def measure_records(target: PreTrainedModel, draft: PreTrainedModel, folders: list[Path],
                    args: argparse.Namespace) -> dict[str, dict]:
    """Held-out self-distill records: the answer positions (prompt, then answer, one pass each)."""
    _, heldout = split_records(folders, DEFAULT_HELDOUT_FRACTION)
    answers = Tally()
    for record in heldout[: args.max_records]:
        ids = record.ids
        first = len(record.prompt) - 1
        answers.add(logits_of(target, ids)[first:-1], logits_of(draft, ids)[first:-1],
                    torch.tensor(record.answer), greedy=True)
    return {"heldout_answers": answers.summary()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True, help="the target model's folder (and tokenizer)")
    parser.add_argument("--draft", type=Path, required=True, help="the draft model's folder")
    parser.add_argument("--corpus", required=True, help="the --corpus the draft was trained on (train-base's)")
    parser.add_argument("--seq-len", type=int, default=256, help="held-out text windows' length")
    parser.add_argument("--max-windows", type=int, default=128, help="held-out text windows, at most")
    parser.add_argument("--continuations", type=int, default=40, help="greedy continuations of held-out text")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--max-records", type=int, default=10_000, help="held-out records, at most")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-tokens", type=int, default=64, help="tokens generated to time a step; 0: no timing")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    check_pair(target, draft)
    folders = record_folders(args.corpus)
    if folders is None:
        results = measure_text(target, draft, tokenizer, args.corpus, args)
    else:
        results = measure_records(target, draft, folders, args)
    results = {
        "target": str(args.target), "draft": str(args.draft), "corpus": args.corpus,
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target_params": sum(p.numel() for p in target.parameters()),
        **results,
    }
    if args.time_tokens:
        prompt = tokenizer("The", add_special_tokens=True).input_ids
        ms = step_ms({"target": target, "draft": draft}, prompt, args.time_tokens)
        results["step_ms"] = {**ms, "draft_over_target": round(ms["draft"] / ms["target"], 3),
                              "threads": args.threads}
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
