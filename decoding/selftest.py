"""A load-time check that this architecture can verify a tree of candidates in one pass.

Tree verification leans on three things the model code must honour: a custom 4D attention mask,
explicit position ids, and a KV cache whose rows we can move. Rather than keep a list of
architectures that do, we test it: the logits the verify pass gives at each node must equal the
logits of running that node's root-to-node path linearly, and after compacting the cache to one
path, the next step must equal a linear run too. ALiBi models and anything else that ignores or
rejects the mask or the positions fail here and are refused with the reason. (Recurrent models
such as Mamba are refused before, from their layer types: see `kv_cache.attention_layer_types`.)
"""

from __future__ import annotations

import torch

from .errors import DecodingError
from .kv_cache import compact_cache, new_cache
from .model import LoadedModel
from .passes import decode_one_token, run_model, tree_inputs
from .tree import Tree

SELF_TEST_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype == torch.float32 else 3e-2


def _linear_logits(lm: LoadedModel, tokens: list[int]) -> torch.Tensor:
    """Logits after the last of `tokens`, run from scratch with no tree and no tricks."""
    logits, _ = run_model(lm, tokens, new_cache(lm.model.config), last_only=True)
    return logits[-1].float()


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    return bool((a.float() - b.float()).abs().max() <= _tolerance(dtype) * (b.abs().max() + 1.0))


def _refuse(lm: LoadedModel, reason: str) -> DecodingError:
    return DecodingError(f"{lm.name} ({lm.model.config.model_type}) cannot use Medusa tree attention: {reason}")


@torch.inference_mode()
def check_tree_attention(lm: LoadedModel, seed: int = 0) -> None:
    """Raise DecodingError unless tree verification reproduces linear decoding on this model.

    Only a real mismatch is reported as the architecture's fault; any other exception is let
    through, because it is a bug in this code, not a property of the model.
    """
    tree = Tree.from_choices(SELF_TEST_TREE, num_heads=3, name="self-test")
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (6,), generator=generator).tolist()
    node_tokens = torch.randint(0, vocab, (tree.size,), generator=generator)
    cache = new_cache(lm.model.config, for_trees=True)
    run_model(lm, prefix, cache)
    if cache.get_seq_length() != len(prefix):
        raise _refuse(lm, "its forward pass does not keep keys and values in the cache it is given")
    mask, positions = tree_inputs(lm, tree, cache)
    try:
        tree_logits, _ = run_model(lm, node_tokens.to(lm.device), cache, mask, positions)
    except Exception as e:  # raised by the model's own code: it does not take a tree as input
        raise _refuse(lm, f"its forward pass rejects a tree attention mask ({type(e).__name__}: "
                          f"{' '.join(str(e).split())})") from e
    for node in range(tree.size):
        path = prefix + node_tokens[tree.path_to(node)].tolist()
        if not _close(tree_logits[node], _linear_logits(lm, path), lm.dtype):
            raise _refuse(lm, f"tree node {node} gave different logits than running its path linearly "
                              "(the model ignores the tree mask or the position ids)")
    deepest = tree.path_to(tree.size - 1)
    compact_cache(cache, len(prefix), deepest)
    next_token = int(node_tokens[0])
    after = decode_one_token(lm, next_token, cache)
    expected = _linear_logits(lm, prefix + node_tokens[deepest].tolist() + [next_token])
    if not _close(after, expected, lm.dtype):
        raise _refuse(lm, "decoding after cache compaction differs from a linear run")
