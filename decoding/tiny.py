"""Tiny random models built from configs, for tests and for trying the app before any training.

Their weights are random, so their text is gibberish; what matters is that they are real
transformers models of real architectures, loaded through the same code paths as a 7B model.
The initialisation is widened so the logits are far apart: greedy choices are then not near-ties,
and tree verification (which sums in another order than linear decoding) cannot flip them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from .eagle_layer import EAGLE_DIR, EagleConfig, EagleHead
from .medusa_modules import HeadsConfig, MedusaHeads
from .mtp_modules import MTP_DIR, MTPConfig, MTPModules

TOKENIZER_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. The quick brown fox jumps over the lazy dog. Medusa heads guess "
    "several tokens ahead, and one forward pass checks them all against the model. "
) * 4


def tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with `vocab_size` entries, trained in a blink on a few lines."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([TOKENIZER_TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


# Families whose decoder layers differ from Llama's in ways a draft layer must follow: rotary by
# layer type (gemma3_text, olmo3), partial rotary and an older cache argument (gpt_neox), sliding
# windows (mistral, starcoder2, and the mixes of gemma3_text and olmo3).
OTHER_ARCHITECTURES = ("gemma3_text", "olmo3", "gpt_neox", "mistral", "starcoder2")


def tiny_config(arch: str, vocab_size: int, hidden: int = 64, layers: int = 2):
    common = dict(vocab_size=vocab_size, eos_token_id=0, bos_token_id=0, pad_token_id=0)
    if arch == "llama":
        return LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=512, **common)
    if arch == "qwen2":
        return Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=512, **common)
    if arch == "gpt2":
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=512, **common)
    if arch in OTHER_ARCHITECTURES:
        # Any other model type the library knows, at the same tiny size; a short sliding window
        # where the family has one, so that a 40-token run crosses it (only there: the library's
        # cache would apply a window to any config that names one, unlike the model's own masks).
        window = {} if arch == "gpt_neox" else {"sliding_window": 16}
        return AutoConfig.for_model(arch, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                                    max_position_embeddings=512, **window, **common)
    raise ValueError(f"unknown tiny architecture {arch!r}")


def tiny_model(arch: str = "llama", vocab_size: int = 320, seed: int = 0, hidden: int = 64,
               layers: int = 2, init_std: float = 0.25) -> PreTrainedModel:
    """A random model of a real architecture with well-separated logits."""
    config = tiny_config(arch, vocab_size, hidden, layers)
    config.initializer_range = init_std
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def make_tiny_model_dir(path: str | Path, arch: str = "llama", num_heads: int = 4,
                        vocab_size: int = 320, seed: int = 0) -> Path:
    """Write a loadable model directory: config, weights, tokenizer, (untrained) heads, a draft
    model in `draft/` (a smaller random Llama over the same vocabulary) and, where the layers
    take rotary positions, a random EAGLE draft head in `eagle/` and two random multi-token
    prediction modules in `mtp/`."""
    path = Path(path)
    draft = tiny_model("llama", vocab_size, seed + 1, hidden=32, layers=1)
    draft.save_pretrained(path / "draft")
    model = tiny_model(arch, vocab_size, seed)
    model.generation_config.eos_token_id = None  # random models hit EOS by chance; let them run
    model.save_pretrained(path)
    tiny_tokenizer(vocab_size).save_pretrained(path)
    heads = MedusaHeads(HeadsConfig(num_heads, 1, model.config.get_text_config().hidden_size, vocab_size))
    heads.init_from_lm_head(model.get_output_embeddings())
    heads.save(path, extra={"base_model": f"tiny-{arch}", "default_tree": "cpu-12"})
    if arch != "gpt2":  # GPT-2's blocks take no rotary positions: it has no EAGLE head (see eagle.py)
        torch.manual_seed(seed + 2)
        EagleHead(EagleConfig(model.config.hidden_size, vocab_size), model).save(path / EAGLE_DIR)
        MTPModules(MTPConfig(model.config.hidden_size, vocab_size, depth=2), model).save(path / MTP_DIR)
    return path
