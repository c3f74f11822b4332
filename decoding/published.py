"""Published Medusa checkpoints we know how to load, with what they need to run well.

These live on the Hugging Face hub; users with the internet (e.g. a GPU Space) load them by name.
Nothing here is downloaded in tests: they build fake checkpoints in the same layouts instead.
"""

from __future__ import annotations

from dataclasses import dataclass

VICUNA_TEMPLATE = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user's questions. USER: {prompt} ASSISTANT:"
)
ZEPHYR_TEMPLATE = "<|user|>\n{prompt}</s>\n<|assistant|>\n"
# A 68M-parameter Llama distilled from Vicuna's answers, over the same tokenizer: the draft model
# transformers' assisted generation docs and SpecInfer use for Vicuna.
VICUNA_DRAFT = "double7/vicuna-68m"


@dataclass(frozen=True)
class RegistryEntry:
    heads: str  # hub id holding the heads (v0.1) or the whole model with heads (v1.0)
    base: str | None  # hub id of the base model; None when the heads repo is a whole model
    layout: str  # "v0.1" or "v1.0"
    description: str
    weights_gb: float  # the model's weights in fp16/bf16, the dtype a GPU runs it in
    prompt_template: str = "{prompt}"
    tree: str = "mc_sim_7b_63"
    # A small model over the same tokenizer, for the draft-model drafter (a hub id), if one is known.
    draft: str | None = None
    # A published EAGLE-1 draft head for the same base model (a hub id), if one is known.
    eagle: str | None = None

    def fits(self, gpu_memory_gb: float) -> bool:
        """Whether a GPU of this size holds the weights, with a fifth more for the KV cache and activations."""
        return 1.2 * self.weights_gb <= gpu_memory_gb


MODEL_REGISTRY: dict[str, RegistryEntry] = {
    "medusa-vicuna-7b-v1.3": RegistryEntry(
        heads="FasterDecoding/medusa-vicuna-7b-v1.3",
        base="lmsys/vicuna-7b-v1.3",
        layout="v0.1",
        eagle="yuhuili/EAGLE-Vicuna-7B-v1.3",
        description="Vicuna-7B v1.3 with the paper's 5 Medusa-1 heads (about 14 GB in fp16)",
        weights_gb=14,
        prompt_template=VICUNA_TEMPLATE,
        draft=VICUNA_DRAFT,
    ),
    "medusa-vicuna-13b-v1.3": RegistryEntry(
        heads="FasterDecoding/medusa-vicuna-13b-v1.3",
        base="lmsys/vicuna-13b-v1.3",
        layout="v0.1",
        eagle="yuhuili/EAGLE-Vicuna-13B-v1.3",
        description="Vicuna-13B v1.3 with 5 Medusa-1 heads (about 26 GB in fp16)",
        weights_gb=26,
        prompt_template=VICUNA_TEMPLATE,
        draft=VICUNA_DRAFT,
    ),
    "medusa-vicuna-33b-v1.3": RegistryEntry(
        heads="FasterDecoding/medusa-vicuna-33b-v1.3",
        base="lmsys/vicuna-33b-v1.3",
        layout="v0.1",
        eagle="yuhuili/EAGLE-Vicuna-33B-v1.3",
        description="Vicuna-33B v1.3 with 5 Medusa-1 heads (about 65 GB in fp16)",
        weights_gb=65,
        prompt_template=VICUNA_TEMPLATE,
        draft=VICUNA_DRAFT,
    ),
    "medusa-1.0-vicuna-7b-v1.5": RegistryEntry(
        heads="FasterDecoding/medusa-1.0-vicuna-7b-v1.5",
        base=None,
        layout="v1.0",
        description="Vicuna-7B v1.5 trained jointly with its heads (Medusa-2)",
        weights_gb=14,
        prompt_template=VICUNA_TEMPLATE,
        draft=VICUNA_DRAFT,
    ),
    "medusa-1.0-zephyr-7b-beta": RegistryEntry(
        heads="FasterDecoding/medusa-1.0-zephyr-7b-beta",
        base=None,
        layout="v1.0",
        description="Zephyr-7B-beta (Mistral) with Medusa heads",
        weights_gb=15,
        prompt_template=ZEPHYR_TEMPLATE,
    ),
}
