"""Which of the base model's hidden states a drafter reads, and how a pass hands them over.

`output_hidden_states` gives one state per layer boundary: index i < n is the input of layer i
(the embeddings at 0) and the last (-1, or n) is the post-norm state the lm_head reads. Medusa's
heads and EAGLE-1 read that last one; EAGLE-3 reads a low, a middle and a high layer's, because
the low layers still hold which token is where and the high ones what comes next. A drafter names
the indices it reads; the passes return those states side by side, (T, len(layers) * H).
"""

from __future__ import annotations

import torch

FINAL_STATE = (-1,)


def chosen_states(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """The states of `layers` for batch row 0, side by side: (T, len(layers) * H)."""
    if len(layers) == 1:  # every round of Medusa and EAGLE-1: no copy
        return hidden_states[layers[0]][0]
    return torch.cat([hidden_states[i][0] for i in layers], dim=-1)
