"""The `mtp` drafter: the model's own multi-token prediction modules guess a chain (see mtp.py).

Module k reads, at position i, module k-1's state there and the token k places on; it predicts
the token after that. So each round, with the text t_0..t_n and the root t_{n+1} (the token the
base model just chose):

    module 1 at position n reads (base state h_n, root)            -> guess g_{n+2}
    module 2 at position n reads (module 1's state there, g_{n+2}) -> guess g_{n+3}
    ...

Each module attends over its own states at every earlier position, as in training, so it keeps
a KV cache of its own. Module k's row at position i is *true* once t_{i+k} is text (i <= n+1-k);
the rows after it are read with this round's guesses, then cropped, and read again next round
with what was accepted. The modules' true states wait in `known[k]` for module k+1 to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import DecodingError
from ..features import FINAL_STATE
from ..kv_cache import new_cache
from ..medusa_modules import few_rows_projection
from ..model import LoadedModel
from ..model_files import local_or_hub
from ..mtp_modules import MTP_DIR, MTPModules, causal_mask, keeps_mtp_layers, load_mtp
from ..packed_linear import pack_linear_layers
from ..settings import DecodeSettings, Setting
from ..trace import DrafterInfo
from .base import MAX_CHAIN, Drafter, ModelFiles, Proposal, chain_proposal, chain_tree, root_only
from .registry import register

NAME = "mtp"
SHOWN_GUESSES = 3  # each module's top guesses a traced round keeps, for the page to show


@dataclass
class MTPPart:
    """What a model's MTP modules draft with: the modules, and the lm_head laid out for few rows."""

    modules: MTPModules
    lm_head: torch.nn.Module
    accuracy: list[float] | None  # held-out top-1 per depth, as training measured it


@register
class MTPDrafter(Drafter):
    name = NAME
    label = "MTP"
    description = "multi-token prediction (modules trained with the model)"
    in_sentence = "the MTP modules"
    who_guessed = "MTP modules"
    drafts_with = ("modules trained with the model from the start, one per token ahead, each reading the "
                   "guess before it (see *After Medusa*)")
    guess_name = "module"
    colour = "#65A30D"
    settings = (Setting("mtp_modules", None, 1, MAX_CHAIN, "MTP modules that guess each round",
                        unset="all the model has", label="MTP: modules used", page_high=8),)
    source_help = ("directory or hub id of multi-token prediction modules (the project's layout, or a "
                   "DeepSeek-V3 / MiMo checkpoint that keeps them), for the mtp drafter")
    hidden_layers = FINAL_STATE

    def __init__(self, lm: LoadedModel, depth: int) -> None:
        part: MTPPart = lm.parts[NAME]
        self.modules, self.lm_head, self.device, self.dtype = part.modules, part.lm_head, lm.device, lm.dtype
        self.depth = depth
        self.tree = chain_tree(depth)
        self.embed = lm.model.get_input_embeddings()
        self.tokens: list[int] = []
        self.known: list[torch.Tensor] = []
        self.caches: list = []

    @classmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> MTPDrafter:
        depth = lm.parts[NAME].modules.config.depth
        asked = settings.options.get("mtp_modules")
        if asked is not None and asked > depth:
            raise DecodingError(f"--mtp-modules {asked}: {lm.name} has {depth} MTP module(s)")
        return cls(lm, asked or depth)

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        asked = settings.options.get("mtp_modules")
        return f"a chain of {asked} guesses" if asked else "a chain, a guess per module"

    def recorded_options(self, settings: DecodeSettings) -> dict[str, int | float | None]:
        return {"mtp_modules": self.depth}

    def begin(self, prompt_ids: list[int], states: torch.Tensor | None) -> None:
        self.tokens = list(prompt_ids)
        empty = states[:0]
        # known[k]: module k's true states (the base model's for k = 0) that module k+1 has not read
        self.known = [states] + [empty] * self.depth
        self.caches = [new_cache(module.layer_config) for module in self.modules.depths[:self.depth]]

    def _read(self, k: int, states: torch.Tensor, line: list[int]) -> torch.Tensor:
        """Module k over the positions from its cache's end to the text's last, reading `states`
        (the previous depth's there) and the tokens k places on; returns its states there."""
        module, cache = self.modules.depths[k - 1], self.caches[k - 1]
        start, last = cache.get_seq_length(), len(self.tokens) - 1
        ids = torch.tensor(line[start + k:last + k + 1], device=self.device)
        positions = torch.arange(start, last + 1, device=self.device)
        mask = causal_mask(len(ids), start, self.dtype, self.device)
        return module(states[None], self.embed(ids)[None], positions[None], cache, mask)[0]

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        depth = min(self.depth, max_depth)
        if depth < 1:
            return root_only(self.tree, root, self.device)
        line, last = self.tokens + [root], len(self.tokens) - 1
        states = self.known[0]
        top_tokens, top_probs = [], []
        for k in range(1, depth + 1):
            start = self.caches[k - 1].get_seq_length()
            out = self._read(k, states, line)
            logits = self.lm_head(self.modules.depths[k - 1].out_norm(out[-1:])).float()[0]
            top_logits, tokens = logits.topk(SHOWN_GUESSES if with_probs else 1)
            line.append(int(tokens[0]))
            if with_probs:  # probabilities for the page only: a greedy round needs the argmax alone
                top_tokens.append(tokens)
                top_probs.append((top_logits - logits.logsumexp(-1)).exp())
            # Rows whose token k places on is text are true: kept, and their states wait for module
            # k+1. The rest read this round's guesses: cropped, read again next round.
            true_rows = max(0, min(len(out), last + 2 - k - start))
            guessed_rows = len(out) - true_rows
            if guessed_rows:
                self.caches[k - 1].crop(-guessed_rows)
            self.known[k - 1] = self.known[k - 1][true_rows:]
            self.known[k] = torch.cat([self.known[k], out[:true_rows]])
            states = torch.cat([self.known[k], out[true_rows:]])
        proposal = chain_proposal(self.tree, root, line[-depth:], self.device)
        if with_probs:
            proposal.guesses, proposal.guess_probs = torch.stack(top_tokens), torch.stack(top_probs)
            proposal.origins = ["the base model"] + [
                f"MTP module {k}: its first guess ({float(p[0]):.0%}), after "
                f"{'the root' if k == 1 else f'module {k - 1}’s guess'}" for k, p in enumerate(top_probs, start=1)]
        return proposal

    def advance(self, written: list[int], states: torch.Tensor | None) -> None:
        # The verify pass computed the base model's true state at the root and every accepted node.
        self.tokens += written
        self.known[0] = torch.cat([self.known[0], states])

    def info(self) -> DrafterInfo:
        parameters = [p for module in self.modules.depths[:self.depth] for p in module.parameters()]
        cache_bytes = sum(t.numel() * t.element_size() for cache in self.caches for layer in cache.layers
                          if layer.is_initialized for t in (layer.keys, layer.values))
        return DrafterInfo(self.name, f"{self.depth} MTP module(s) ({self.modules.config.layout} layout), "
                           "a chain of a guess each", sum(p.numel() for p in parameters),
                           sum(p.numel() * p.element_size() for p in parameters), cache_bytes)

    # ----- what it needs, and where that comes from -----
    @classmethod
    def available(cls, lm: LoadedModel) -> bool:
        return NAME in lm.parts

    @classmethod
    def missing(cls, lm: LoadedModel) -> str:
        return (f"{lm.name} has no multi-token prediction modules: they are trained with a model from the "
                "start (`python -m decoding train-base --mtp-depth 3`), or pass --mtp with a checkpoint "
                "that keeps them (DeepSeek-V3, MiMo)")

    @classmethod
    def held_out_accuracy(cls, lm: LoadedModel) -> list[float] | None:
        return lm.parts[NAME].accuracy if NAME in lm.parts else None

    @classmethod
    def shipped(cls, files: ModelFiles) -> str | Path | None:
        """`mtp/` beside the model's heads, as train-base --mtp-depth saves them; else the
        checkpoint itself, where its config says it keeps MTP layers (DeepSeek-V3, MiMo)."""
        if (files.heads_dir / MTP_DIR).is_dir():
            return files.heads_dir / MTP_DIR
        return files.heads_dir if keeps_mtp_layers(files.heads_dir) else None

    @classmethod
    def load(cls, lm: LoadedModel, source: str | Path, files: ModelFiles) -> None:
        modules, meta = load_mtp(local_or_hub(source, "MTP modules"), lm.model)
        modules = modules.to(device=lm.device, dtype=lm.dtype).eval().requires_grad_(False)
        if files.pack_linear:
            pack_linear_layers(modules)
        accuracy = meta.get("accuracy")
        valid = isinstance(accuracy, list) and all(isinstance(a, int | float) and 0 <= a <= 1 for a in accuracy)
        lm.parts[NAME] = MTPPart(modules, few_rows_projection(lm.model.get_output_embeddings()),
                                 [float(a) for a in accuracy] if valid else None)
