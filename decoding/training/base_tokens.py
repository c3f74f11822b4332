"""The tokens a base model trains on: a tokenizer trained on the corpus, or a given one's special
ids, and documents turned into the one stream training windows are cut from.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..errors import DecodingError
from .corpus import DOC_SEPARATOR

MAX_POSITIONS = 1024  # the base model's context, and its tokenizer's model_max_length


def train_tokenizer(train_text: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with one special token used as BOS, EOS and PAD.

    Byte-level means any input round-trips (no unknown tokens) and decoding
    restores spaces. The post-processor prepends BOS, matching training where
    every document follows the separator, so a prompt looks like a fresh
    document to the model.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[DOC_SEPARATOR],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(train_text.split(DOC_SEPARATOR), trainer=trainer)
    eos_id = tokenizer.token_to_id(DOC_SEPARATOR)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{DOC_SEPARATOR} $A",
        pair=f"{DOC_SEPARATOR} $A {DOC_SEPARATOR} $B",
        special_tokens=[(DOC_SEPARATOR, eos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=DOC_SEPARATOR,
        eos_token=DOC_SEPARATOR,
        pad_token=DOC_SEPARATOR,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int, int]:
    """``(bos, eos, pad)`` ids for the model: the tokenizer's own, a missing BOS or PAD being EOS.

    A tokenizer trained here has one special token that is all three; a given one (say a chat
    model's) may have three different ones, or no BOS or PAD at all.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DecodingError("the tokenizer has no EOS token: a model trained for it could never stop")
    bos = eos if tokenizer.bos_token_id is None else tokenizer.bos_token_id
    pad = eos if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    return bos, eos, pad


def encode_documents(tokenizer: PreTrainedTokenizerBase, text: str) -> list[list[int]]:
    """Token ids of each document, each starting with BOS (as a prompt does at inference).

    The tokenizer adds its own special tokens; where it adds no BOS (a chat model's may not),
    BOS is put first, so that every document still starts at a boundary the model can see.
    """
    bos = special_ids(tokenizer)[0]
    docs = [d for d in text.split(DOC_SEPARATOR) if d.strip()]
    encodings = tokenizer(docs, add_special_tokens=True)["input_ids"]
    return [ids if ids[:1] == [bos] else [bos, *ids] for ids in encodings]


def token_stream(documents: list[list[int]]) -> torch.Tensor:
    """All documents' ids, one after another, as the stream training windows are cut from."""
    return torch.tensor([i for ids in documents for i in ids], dtype=torch.long)
