"""The `medusa` drafter: the base model's own extra heads guess the next few tokens.

Head k reads the hidden state that chose the root and guesses the token k places after it; the
tree takes each head's top few guesses. No extra pass of any model: the hidden state comes free
with the previous verify pass.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoints import find_heads
from ..cost_curve import model_cost_curve
from ..errors import DecodingError
from ..features import FINAL_STATE
from ..medusa_modules import MEDUSA, MedusaPart, heads_count, medusa_part
from ..model import LoadedModel
from ..model_files import local_or_hub
from ..passes import draft
from ..settings import DecodeSettings, Setting
from ..trace import DrafterInfo
from ..tree import Tree, read_choices
from ..tree_choice import AUTO_TREE, EVERY_HEAD_TREE, TreeChoice, choose_tree
from .base import Drafter, ModelFiles, Proposal, root_only
from .registry import register

# More heads than any published checkpoint has; a model's own count is checked when it runs.
MAX_HEADS = 16
# The trees chosen on this machine (tree_choice.py), by name, beside the presets, each with what it is.
CHOSEN_TREES = {AUTO_TREE: "the fastest tree here", EVERY_HEAD_TREE: "the fastest tree that uses every head"}


def resolve_tree(lm: LoadedModel, settings: DecodeSettings) -> Tree:
    """The tree to verify each round, as the settings ask for it (`medusa_tree`)."""
    return medusa_tree(lm, settings.tree, settings.options.get("num_heads"))


def medusa_tree(lm: LoadedModel, spec: str | list[list[int]] | None, num_heads: int | None = None) -> Tree:
    """The one place a tree is read: `spec` is a tree's name ("default": the heads' own), or a
    choices list, as a list or as JSON text (`[[0], [0, 0], [1]]`). A choices list must fit the
    model's heads; then, as a preset, it is cut to the first `num_heads` heads (default: all), so
    its paths are at most `num_heads` deep. Runs and the page's tree editor both read it here."""
    part = medusa_part(lm)
    if part is None:
        raise DecodingError(MedusaHeadsDrafter.missing(lm))
    num_heads = num_heads or part.num_heads
    if num_heads > part.num_heads:
        raise DecodingError(f"{lm.name} has {part.num_heads} heads; cannot use {num_heads}")
    if spec is None or spec == "default":
        spec = lm.default_tree
    if isinstance(spec, str) and spec.lstrip().startswith("["):
        spec = read_choices(spec)
    if isinstance(spec, str):
        tree = named_tree(lm, spec, num_heads)
    else:
        Tree.from_choices(spec, part.num_heads)  # every path fits the model's heads
        tree = Tree.pruned(spec, num_heads, "custom")
    vocab = part.heads.guess_vocab_size
    if tree.top_k > vocab:
        raise DecodingError(f"the tree reads rank {tree.top_k - 1} but the vocabulary has {vocab} tokens")
    return tree


def fastest_tree_forecast(lm: LoadedModel) -> TreeChoice | None:
    """What `--tree auto` expects of the fastest tree here, before anything runs: from the heads'
    held-out accuracy and the cost curve measured when the model loaded (None without either)."""
    part = medusa_part(lm)
    if part is None or part.accuracy is None or lm.cost_curve is None:
        return None
    return choose_tree(part.accuracy, lm.cost_curve)


def tree_names(lm: LoadedModel) -> list[str]:
    """Every tree a run may name: the two chosen here, then the presets and the heads' own."""
    return [*CHOSEN_TREES, *lm.trees]


def named_tree(lm: LoadedModel, name: str, num_heads: int | None = None) -> Tree:
    """One of the model's trees by name, cut to the first `num_heads` heads (default: all): a tree
    chosen on this machine (CHOSEN_TREES), a preset, or one shipped with the heads."""
    num_heads = num_heads or heads_count(lm)
    if name in CHOSEN_TREES:
        return chosen_tree(lm, name, num_heads)
    if name not in lm.trees:
        raise DecodingError(f"unknown tree {name!r}; known trees: {', '.join(tree_names(lm))}")
    return Tree.pruned(lm.trees[name], num_heads, name)


def chosen_tree(lm: LoadedModel, name: str, num_heads: int) -> Tree:
    """The tree `name` (one of CHOSEN_TREES) stands for, by the heads' accuracies and this
    machine's cost curve: the fastest tree, or the fastest that reaches every head in use.

    Heads saved without an accuracy table (published checkpoints) keep their default tree.
    """
    accuracy = medusa_part(lm).accuracy
    if accuracy is None:
        return Tree.pruned(lm.trees[lm.default_tree], num_heads, lm.default_tree)
    reach = num_heads if name == EVERY_HEAD_TREE else 1
    choice = choose_tree(accuracy[:num_heads], model_cost_curve(lm), reach=reach)
    return Tree.from_choices(choice.choices, num_heads, name=choice.name)


@register
class MedusaHeadsDrafter(Drafter):
    name = MEDUSA
    label = in_sentence = "Medusa"
    description = "Medusa heads"
    who_guessed = "heads"
    drafts_with = "heads on the big model's own last state (next step), with no cache and no pass of their own"
    guess_name = "head"
    colour = "#4F46E5"
    settings = (Setting("num_heads", None, 1, MAX_HEADS, "use only the first n heads (cuts the tree to depth n)",
                        unset="all the model's heads", label="Heads to use", model_bound=True),)
    takes_tree = True
    weighs_in_dtype_choice = True
    hidden_layers = FINAL_STATE

    @classmethod
    def available(cls, lm: LoadedModel) -> bool:
        return medusa_part(lm) is not None

    @classmethod
    def missing(cls, lm: LoadedModel) -> str:
        return f"{lm.name} was loaded without Medusa heads: only plain decoding (method ar) can run"

    @classmethod
    def model_limit(cls, lm: LoadedModel, setting: Setting) -> int | float:
        return heads_count(lm)

    @classmethod
    def held_out_accuracy(cls, lm: LoadedModel) -> list[float] | None:
        """Each head's top-1 rate on held-out text, as saved with the heads."""
        part = medusa_part(lm)
        return None if part is None or part.accuracy is None else [row[0] for row in part.accuracy]

    @classmethod
    def shipped(cls, files: ModelFiles) -> str | Path | None:
        """The model's heads directory: a directory without heads is refused when read, never passed over."""
        return files.heads_dir

    @classmethod
    def load(cls, lm: LoadedModel, source: str | Path, files: ModelFiles) -> None:
        """The heads in `source`, in any layout (checkpoints.py); their config also names the
        trees that ship with them and their default."""
        heads, meta = find_heads(local_or_hub(source, "Medusa heads"), lm.model)
        heads = heads.to(device=lm.device, dtype=lm.dtype).eval().requires_grad_(False)
        lm.parts[cls.name] = MedusaPart(heads, accuracy_table(meta), lm.model.get_output_embeddings())
        lm.trees.update(meta.get("trees", {}))
        lm.default_tree = meta.get("default_tree") or lm.default_tree

    @classmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> MedusaHeadsDrafter:
        return cls(lm, resolve_tree(lm, settings))

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        return f"tree {settings.tree}"

    def recorded_options(self, settings: DecodeSettings) -> dict[str, int | float | None]:
        return {"num_heads": settings.options.get("num_heads") or self.part.num_heads}

    def __init__(self, lm: LoadedModel, tree: Tree) -> None:
        self.lm, self.part, self.tree = lm, medusa_part(lm), tree
        self._draft_index = tree.draft_index.to(lm.device)

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        tree, index = self.tree, self._draft_index
        if max_depth < tree.max_depth:  # near the context limit: only the levels that fit
            tree = tree.cut(max_depth)
            index = tree.draft_index.to(self.lm.device)
        if tree.max_depth == 0:
            return root_only(tree, root, self.lm.device)
        top_tokens, top_probs = draft(self.lm, self.part, hidden, tree, root, with_probs=with_probs)
        root_tensor = torch.tensor([root], device=self.lm.device)
        tokens = torch.cat([root_tensor, top_tokens.flatten()[index]])
        return Proposal(tree, tokens, guesses=top_tokens, guess_probs=top_probs)

    def info(self) -> DrafterInfo:
        heads = self.part.heads
        parameters = sum(p.numel() for p in heads.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in heads.parameters())
        origin = f"heads {heads.origin}" if heads.origin else ""
        return DrafterInfo(self.name, f"{heads.num_heads} Medusa heads on {self.lm.name}", parameters, weight_bytes,
                           origin=origin)


def accuracy_table(meta: dict) -> list[list[float]] | None:
    """The heads' measured accuracy per rank (`acc[head][rank]`), if saved and well formed."""
    table = meta.get("accuracy")
    rows_ok = isinstance(table, list) and table and all(isinstance(row, list) and row for row in table)
    if not rows_ok or len({len(row) for row in table}) != 1:
        return None
    if not all(isinstance(a, int | float) and 0.0 <= a <= 1.0 for row in table for a in row):
        return None
    return [[float(a) for a in row] for row in table]
