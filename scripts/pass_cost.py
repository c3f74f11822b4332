"""What a T-token pass costs on this CPU, in one-token steps, with and without packed linear layers.

    python -m scripts.pass_cost                        # the fetched SmolLM2, 1 and 2 threads
    python -m scripts.pass_cost --model DIR --threads 1 --hints 1 8

For each thread count, every variant (eager `F.linear`, and `PackedLinear` packed with each batch
hint) is timed in turn, round after round, so a busy machine slows them alike; the table shows
medians. A pass feeds T tokens after `--past` cached ones with a 4D additive mask and explicit
positions, as a verify pass does (a chain: the mask's shape, not its pattern, sets the cost).
Costs are in eager one-token steps. PackedLinear runs one row through `F.linear` too, except for
the lm_head, whose one row goes through its packed copy as in the engine: the packed variants'
own step column is the step plain decoding takes there.
It also checks that the logits of one 8-token pass match those of 8 single steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache

from decoding.fetch import fetched_dir
from decoding.packed_linear import PackedLinear, can_pack


def chain_mask(past: int, size: int) -> torch.Tensor:
    """(1, 1, T, past + T) additive mask: each new token sees the past and the new ones before it."""
    blocked = torch.finfo(torch.float32).min
    new = torch.full((size, size), blocked).triu(1)
    return torch.cat([torch.zeros(size, past), new], dim=1)[None, None]


def forward(model: nn.Module, tokens: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """One pass over `tokens` (T,) after the cache: logits (T, V). The cache grows by T."""
    past, size = cache.get_seq_length(), tokens.numel()
    positions = torch.arange(past, past + size).view(1, -1)
    out = model(input_ids=tokens.view(1, -1), attention_mask=chain_mask(past, size),
                position_ids=positions, cache=cache, use_cache=True)
    return out.logits[0]


def timed_pass(model: nn.Module, tokens: torch.Tensor, cache: DynamicCache) -> float:
    start = time.perf_counter()
    forward(model, tokens, cache)
    seconds = time.perf_counter() - start
    cache.crop(-tokens.numel())
    return seconds


class Variants:
    """Switch a model's linear layers between the original ones and packed copies, in place."""

    def __init__(self, model: nn.Module, hints: list[int]) -> None:
        self.slots = [(parent, name, child) for parent in model.modules()
                      for name, child in parent.named_children() if can_pack(child)]
        self.layers = {"eager": [child for _, _, child in self.slots]}
        output = model.get_output_embeddings()  # its one row goes through the packed copy, as the engine's does
        for hint in hints:
            self.layers[f"packed-{hint}"] = [PackedLinear(child, hint, one_row_packed=child is output)
                                             for _, _, child in self.slots]

    def use(self, variant: str) -> None:
        for (parent, name, _), layer in zip(self.slots, self.layers[variant], strict=True):
            setattr(parent, name, layer)


def pass_and_steps(model: nn.Module, prefix: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of `tokens` after `prefix`: from one pass over them all, and from one step each."""
    cache = DynamicCache()
    forward(model, prefix, cache)
    together = forward(model, tokens, cache)
    cache.crop(-tokens.numel())
    return together, torch.cat([forward(model, token.view(1), cache) for token in tokens])


def compare(a: torch.Tensor, b: torch.Tensor) -> str:
    same = bool((a.argmax(-1) == b.argmax(-1)).all())
    return f"max |logit diff| {(a - b).abs().max().item():.1e}, argmax equal: {same}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: the fetched smollm2)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--hints", type=int, nargs="+", default=[1, 8],
                        help="batch-size hints to pack with (oneDNN picks a layout for that many rows)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 12, 16, 32])
    parser.add_argument("--past", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    source = args.model or fetched_dir("smollm2")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval().requires_grad_(False)
    variants = Variants(model, args.hints)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (args.past,), generator=generator)
    sizes = [1, *args.sizes]
    batches = {size: torch.randint(0, vocab, (size,), generator=generator) for size in sizes}
    eight = torch.randint(0, vocab, (8,), generator=generator)

    with torch.inference_mode():
        eager_pass, _ = pass_and_steps(model, prefix, eight)
        for variant in variants.layers:
            variants.use(variant)
            together, apart = pass_and_steps(model, prefix, eight)
            print(f"{variant:>10}: 8-token pass vs 8 steps: {compare(together, apart)}; "
                  f"vs eager's pass: {compare(together, eager_pass)}")
        variants.use("eager")
        cache = DynamicCache()
        forward(model, prefix, cache)
        for threads in args.threads:
            torch.set_num_threads(threads)
            seconds = {(v, s): [] for v in variants.layers for s in sizes}
            for _ in range(args.rounds):
                for variant in variants.layers:
                    variants.use(variant)
                    for size in sizes:
                        seconds[variant, size].append(timed_pass(model, batches[size], cache))
            print(f"\n{threads} thread(s), past {args.past}, medians of {args.rounds} interleaved rounds, "
                  "T-token pass in eager one-token steps")
            print(f"{'variant':>10} {'step ms':>8} " + " ".join(f"{f'T={s}':>6}" for s in args.sizes))
            eager_step = statistics.median(seconds["eager", 1])
            for variant in variants.layers:
                step = statistics.median(seconds[variant, 1])
                costs = " ".join(f"{statistics.median(seconds[variant, s]) / eager_step:6.2f}" for s in args.sizes)
                print(f"{variant:>10} {step * 1e3:8.1f} {costs}")


if __name__ == "__main__":
    main()
