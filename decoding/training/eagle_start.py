"""How a fresh EAGLE head begins: its draft vocabulary, and a draft layer that starts as the identity.

A draft layer learning from scratch first has to rebuild the lm_head's input space from random
projections. On SmolLM2's chat recording (129k training answer tokens, the same held-out answers)
that cost EAGLE-1's first guess 0.469 held-out top-1 after 4 epochs, against 0.488 for a Medusa head
1 trained alike; started as the identity, as Medusa's heads start, it reached 0.489
(docs/measured.md has the whole comparison).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from ..eagle_layer import EagleConfig, EagleHead
from .recorded_heads import choose_draft_vocab
from .train_eagle import EagleTrainingSettings, Sequence

# The linear layers through which a decoder layer's attention and MLP write into the residual
# stream, by the names the families with rotary layers give them (Llama, Qwen, Mistral, Gemma: the
# first two; GPT-NeoX: the last two).
RESIDUAL_OUTPUTS = ("o_proj", "down_proj", "dense", "dense_4h_to_h")
STARTS = ("identity", "random")


def start_as_identity(head: EagleHead) -> None:
    """Make the untrained draft layer return the text's feature f_j unchanged.

    fc reads [embedding; feature] and starts as [0 | I], so the layer's residual stream starts as
    f_j; its attention and MLP start at zero (their output projections zeroed), so the layer adds
    nothing. The untrained head therefore says what the base model's lm_head says at j, exactly
    where Medusa's heads start, and training only has to learn the *change* from there: a layer
    learning from scratch has to rebuild the lm_head's input space from random projections first,
    which a few hundred thousand tokens cannot teach. A fused head's fuse starts by picking the
    final state, which is the last of the layers it reads.
    """
    hidden = head.config.hidden_size
    outputs = [m for name, m in head.layer.named_modules()
               if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in RESIDUAL_OUTPUTS]
    if len(outputs) != 2:
        raise ValueError(f"{type(head.layer).__name__}: cannot tell its attention's and MLP's output projections")
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, hidden:].copy_(torch.eye(hidden))
        if head.fc.bias is not None:
            head.fc.bias.zero_()
        if head.fuse is not None:
            head.fuse.weight.zero_()
            head.fuse.weight[:, -hidden:].copy_(torch.eye(hidden))
        for linear in outputs:
            linear.weight.zero_()
            if linear.bias is not None:
                linear.bias.zero_()


def new_eagle_head(base: PreTrainedModel, train: list[Sequence], settings: EagleTrainingSettings,
                   text_layers: list[int] | None = None) -> EagleHead:
    """A fresh head over the draft vocabulary of the tokens the training answers hold most; it
    fuses the states of `text_layers` (EAGLE-3) or, with None, reads the final state (EAGLE-1)."""
    text = base.config.get_text_config(decoder=True)
    tokens = torch.cat([s.tokens[s.answer_start:] for s in train])
    vocab = choose_draft_vocab(tokens, settings.draft_vocab_size, text.vocab_size)
    torch.manual_seed(settings.seed)
    config = EagleConfig(text.hidden_size, text.vocab_size, draft_vocab_size=len(vocab), feature_layers=text_layers)
    head = EagleHead(config, base)
    head.draft_vocab.copy_(vocab)
    if settings.start == "identity":
        start_as_identity(head)
    elif settings.start != "random":
        raise ValueError(f"start must be one of {', '.join(STARTS)}, not {settings.start!r}")
    return head
