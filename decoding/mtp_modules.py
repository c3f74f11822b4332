"""Multi-token prediction (DeepSeek-V3, 2024): D small modules, trained with the model, that each
guess one token further ahead.

Medusa bolts heads onto a finished model; MTP trains them *with* it, from the start, as a second
objective. Module k reads, at position i, the state module k-1 left there (module 0 is the base
model: its final state) and the embedding of token t_{i+k}, and predicts t_{i+k+1}:

    h'_i^k = proj([norm(h_i^{k-1}); norm(embedding(t_{i+k}))])
    h_i^k  = block(h'_{<=i}^k)                   (one transformer block, causal over the positions)
    p_i^k  = softmax(lm_head(out_norm(h_i^k)))    (the base model's own embedding and lm_head)

So, unlike Medusa's heads, module k knows the tokens before the one it guesses (the real ones in
training; when drafting, the guesses of modules 1..k-1), and unlike EAGLE it has a module of its
own per depth. The training loss is the base model's plus `weight` times the modules' mean
(`mtp_loss`); DeepSeek-V3 weighted them 0.3, then 0.1 for the last third of its tokens.

Three layouts are read (`load_mtp`): the project's (`mtp/` with `mtp_config.json` and
`mtp.safetensors`), and the two published ones that keep the modules inside the checkpoint as
extra decoder layers: DeepSeek-V3 (`model.layers.{L+k}.eh_proj`, embedding first in the
projection) and MiMo (`model.mtp_layers.{k}.input_proj`, state first).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from .eagle_layer import check_base_shape, decoder_parts, layer_config
from .errors import DecodingError
from .passes import additive_mask

MTP_DIR = "mtp"  # beside a model's Medusa heads: its MTP modules, in the project's layout
MTP_CONFIG = "mtp_config.json"
MTP_WEIGHTS = "mtp.safetensors"
PROJECT, DEEPSEEK_V3, MIMO = "medusa-playground-mtp", "deepseek-v3", "mimo"
# DeepSeek-V3's weight of the MTP loss: 0.3 for its first 10T tokens, then 0.1 (of 14.8T).
LOSS_WEIGHT, LATE_LOSS_WEIGHT, LATE_FROM = 0.3, 0.1, 10 / 14.8


@dataclass
class MTPConfig:
    hidden_size: int
    vocab_size: int
    depth: int  # modules: module k guesses the token k+1 places after the last one read
    # The projection reads [embedding; state] (DeepSeek-V3's checkpoints) or [state; embedding].
    embedding_first: bool = False
    layout: str = PROJECT


def block_config(base_config: PreTrainedConfig) -> PreTrainedConfig:
    """The config a module's block is built from: layer 0 of a one-layer copy of the base's (see
    eagle.layer_config). DeepSeek-V3's MTP layers come after its first dense layers, so they are
    mixture-of-experts layers; built as layer 0, the block must be told."""
    config = layer_config(base_config)
    if getattr(config, "first_k_dense_replace", None):
        config.first_k_dense_replace = 0
    return config


def final_norm(base: PreTrainedModel) -> nn.Module:
    """The base model's final norm (Llama's `norm`, GPT-NeoX's `final_layer_norm`): the modules'
    norms are of its class."""
    decoder = base.get_decoder()
    norm = getattr(decoder, "norm", None) or getattr(decoder, "final_layer_norm", None)
    if norm is None:
        raise DecodingError(f"{base.config.model_type} has no final norm this project finds: no MTP modules for it")
    return norm


class MTPModule(nn.Module):
    """One depth: proj([norm(state); norm(embedding)]) -> the base's own decoder layer class."""

    def __init__(self, config: MTPConfig, base: PreTrainedModel) -> None:
        super().__init__()
        layer_class, rotary, self.cache_argument = decoder_parts(base)
        self.layer_config = block_config(base.config)
        norm = final_norm(base)  # the base's norm class, freshly initialised below
        self.hidden_norm, self.token_norm, self.out_norm = (copy.deepcopy(norm) for _ in range(3))
        for n in (self.hidden_norm, self.token_norm, self.out_norm):
            n.reset_parameters() if hasattr(n, "reset_parameters") else nn.init.ones_(n.weight)
        self.embedding_first = config.embedding_first
        self.proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.block = layer_class(self.layer_config, layer_idx=0)
        self.rotary = type(rotary)(config=self.layer_config)

    def forward(self, states: torch.Tensor, token_embeddings: torch.Tensor, positions: torch.Tensor,
                cache: object, attention_mask: torch.Tensor) -> torch.Tensor:
        """This depth's states (B, T, H) from the previous depth's and the next tokens' embeddings.

        `positions` (B, T) are the positions read; `cache` (a one-layer DynamicCache, or None in
        training) gains a row per input; `attention_mask` (B, 1, T, past + T) is additive.
        """
        parts = [self.hidden_norm(states), self.token_norm(token_embeddings)]
        x = self.proj(torch.cat(parts[::-1] if self.embedding_first else parts, dim=-1))
        rotary = self.rotary(x, positions)
        return self.block(x, attention_mask=attention_mask, position_ids=positions,
                          **{self.cache_argument: cache}, use_cache=cache is not None,
                          position_embeddings=rotary)


class MTPModules(nn.Module):
    """The D modules of a model, in depth order, and what they were measured to guess."""

    def __init__(self, config: MTPConfig, base: PreTrainedModel) -> None:
        super().__init__()
        check_base_shape("these MTP modules are", config.hidden_size, config.vocab_size, base)
        self.config = config
        self.depths = nn.ModuleList(MTPModule(config, base) for _ in range(config.depth))

    def save(self, directory: str | Path, extra: dict | None = None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if ".rotary." not in k}
        save_file(state, str(directory / MTP_WEIGHTS))
        meta = {"format": PROJECT, **asdict(self.config), **(extra or {})}
        (directory / MTP_CONFIG).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def causal_mask(rows: int, past: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(1, 1, rows, past + rows) additive mask: each new row sees the past and the rows before it."""
    visible = torch.ones(rows, past + rows, dtype=torch.bool, device=device).tril(past)
    return additive_mask(visible, dtype)[None, None]


def mtp_logits(modules: MTPModules, base: PreTrainedModel, states: torch.Tensor,
               input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Teacher-forced logits of every depth over a batch of windows.

    `states` (B, T, H) are the base model's final states over `input_ids` (B, T). Depth k at
    position i reads t_{i+k} and predicts t_{i+k+1}, so it has T-k-1 positions with a target.
    """
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    length = input_ids.shape[1]
    positions = torch.arange(length, device=input_ids.device)[None].expand(input_ids.shape[0], -1)
    logits = []
    for k, module in enumerate(modules.depths, start=1):
        rows = length - k - 1
        if rows <= 0:
            break
        mask = causal_mask(rows, 0, states.dtype, states.device)
        states = module(states[:, :rows], embed(input_ids[:, k:k + rows]), positions[:, :rows], None, mask)
        logits.append(lm_head(module.out_norm(states)))
    return logits


def mtp_targets(input_ids: torch.Tensor, depth: int) -> torch.Tensor:
    """What depth `depth` (1-based) predicts at each of its positions: t_{i+depth+1}."""
    return input_ids[:, depth + 1:]


def mtp_loss(modules: MTPModules, base: PreTrainedModel, states: torch.Tensor,
             input_ids: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """The modules' mean cross-entropy (what training adds, weighted) and each depth's, as floats."""
    losses = [F.cross_entropy(logits.flatten(0, 1).float(), mtp_targets(input_ids, k).flatten())
              for k, logits in enumerate(mtp_logits(modules, base, states, input_ids), start=1)]
    return torch.stack(losses).mean(), [loss.item() for loss in losses]


def loss_weight(progress: float) -> float:
    """DeepSeek-V3's schedule, over training progress 0..1."""
    return LOSS_WEIGHT if progress < LATE_FROM else LATE_LOSS_WEIGHT


# ----- loading -----
def _published_keys(config: dict, keys: list[str]) -> tuple[str, dict[str, tuple[int, str]]] | None:
    """For a published checkpoint's weight names: its layout and, per MTP weight, (depth index,
    the project's name within that module); None where it keeps no MTP modules we know."""
    layers, depth = config.get("num_hidden_layers"), config.get("num_nextn_predict_layers") or 0
    if not depth or not isinstance(layers, int):
        return None
    if any(k.startswith("model.mtp_layers.") for k in keys):  # MiMo
        layout, renames = MIMO, {"token_layernorm": "token_norm", "hidden_layernorm": "hidden_norm",
                                 "input_proj": "proj", "final_layernorm": "out_norm"}
        prefixes = {f"model.mtp_layers.{k}.": k for k in range(depth)}
    elif any(k.startswith(f"model.layers.{layers}.eh_proj") for k in keys):  # DeepSeek-V3
        layout, renames = DEEPSEEK_V3, {"enorm": "token_norm", "hnorm": "hidden_norm", "eh_proj": "proj",
                                        "shared_head.norm": "out_norm"}
        prefixes = {f"model.layers.{layers + k}.": k for k in range(depth)}
    else:
        return None
    mapping = {}
    for key in keys:
        prefix = next((p for p in prefixes if key.startswith(p)), None)
        if prefix is None:
            continue
        rest = key[len(prefix):]
        # The embedding and the output head are the base model's (shared), stored again per module.
        if rest.startswith(("embed_tokens.", "shared_head.head.")):
            continue
        part = next((r for r in renames if rest.startswith(r + ".")), None)
        mapping[key] = (prefixes[prefix], renames[part] + rest[len(part):] if part else "block." + rest)
    return layout, mapping


def keeps_mtp_layers(path: Path) -> bool:
    """Whether the checkpoint in `path` says it keeps MTP layers (`num_nextn_predict_layers`)."""
    try:
        depth = json.loads((path / "config.json").read_text(encoding="utf-8")).get("num_nextn_predict_layers")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(depth, int) and depth > 0


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [path / n for n in names]
    return sorted(path.glob("*.safetensors"))


def _load_published(path: Path, base: PreTrainedModel) -> MTPModules | None:
    config_file = path / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text(encoding="utf-8"))
    files = _weight_files(path)
    keys = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            keys.update({k: file for k in f.keys()})  # noqa: SIM118 - safe_open is not a dict
    found = _published_keys(config, list(keys))
    if found is None:
        return None
    layout, mapping = found
    text = base.config.get_text_config(decoder=True)
    modules = MTPModules(MTPConfig(text.hidden_size, text.vocab_size, config["num_nextn_predict_layers"],
                                   embedding_first=layout == DEEPSEEK_V3, layout=layout), base)
    state = {}
    for key, (depth, name) in mapping.items():
        with safe_open(str(keys[key]), framework="pt") as f:
            state[f"depths.{depth}.{name}"] = f.get_tensor(key)
    return _fill(modules, state, path)


def _fill(modules: MTPModules, state: dict[str, torch.Tensor], source: Path) -> MTPModules:
    """Load `state` into `modules`, or a one-line DecodingError naming what does not fit."""
    expected = {k: v.shape for k, v in modules.state_dict().items() if ".rotary." not in k}
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if state[k].shape != expected[k])
    if missing or extra or wrong:
        what = (f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}" if extra
                else f"{wrong[0]} is {tuple(state[wrong[0]].shape)}, expected {tuple(expected[wrong[0]])}")
        raise DecodingError(f"the MTP modules in {source} do not fit this model: {what}")
    modules.load_state_dict(state, strict=False)
    return modules


def load_mtp(path: Path, base: PreTrainedModel) -> tuple[MTPModules, dict]:
    """The MTP modules in `path` (any of the three layouts) for `base`, and their saved record."""
    if (path / MTP_CONFIG).is_file():
        try:
            meta = json.loads((path / MTP_CONFIG).read_text(encoding="utf-8"))
            config = MTPConfig(**{k: meta[k] for k in MTPConfig.__dataclass_fields__ if k in meta})
        except (ValueError, TypeError, KeyError) as err:
            raise DecodingError(f"{path / MTP_CONFIG} is not an MTP config this project wrote: {err}") from None
        if config.layout != PROJECT or not isinstance(config.depth, int) or config.depth < 1:
            raise DecodingError(f"{path / MTP_CONFIG}: layout {config.layout!r}, depth {config.depth!r} "
                                f"is not one this project reads")
        modules = MTPModules(config, base)
        return _fill(modules, load_file(str(path / MTP_WEIGHTS)), path), meta
    modules = _load_published(path, base)
    if modules is None:
        raise DecodingError(
            f"no MTP modules in {path}: expected {MTP_CONFIG} (this project's layout) or a checkpoint "
            "whose config has num_nextn_predict_layers and whose weights keep them as DeepSeek-V3 "
            "(model.layers.N.eh_proj) or MiMo (model.mtp_layers.K.input_proj) do")
    return modules, {}
