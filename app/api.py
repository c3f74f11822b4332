"""The page's one public API endpoint, `/trace`: a whole run as JSON, under the page's limits."""

from __future__ import annotations

from decoding.errors import DecodingError
from decoding.loops import generate
from decoding.settings import DecodeSettings

from .handlers import cache, refusal
from .inputs import api_request, decode_settings
from .models import offered_models, require_offered


def trace_api(prompt: str, max_new_tokens: int = DecodeSettings.max_new_tokens, acceptance: str = "greedy",
              tree: str = "default", num_heads: int = 0, model: str = "",
              temperature: float = DecodeSettings.temperature, seed: int = -1, method: str = "medusa",
              draft_tokens: int = DecodeSettings.draft_tokens,
              lookup_tokens: int = DecodeSettings.lookup_tokens,
              eagle_depth: int = DecodeSettings.eagle_depth, eagle_top_k: int = DecodeSettings.eagle_top_k,
              eagle_nodes: int = 0) -> dict:
    """Decode `prompt` and return the whole trace as JSON (the schema of decoding.trace).

    `method` is "medusa", "eagle", "draft-model", "prompt-lookup" (whichever the model offers) or
    "ar" (plain decoding); `draft_tokens` is the draft model's tokens a round, `lookup_tokens`
    the most tokens prompt lookup copies; an EAGLE run grows its own tree each round,
    `eagle_depth` levels deep with `eagle_top_k` guesses from each of the `eagle_top_k` most
    confident nodes a level, and verifies `eagle_nodes` of them (0: as many as pay here).
    `tree` is a preset name, "default", or a choices list as JSON (Medusa only); `num_heads` 0
    uses all heads; `model` "" uses the page's default model, and any other value must be a model
    the page offers; `seed` -1 draws a fresh one. The page's limits (decoding.limits) apply, as
    they do to a visitor's Run.
    """
    try:
        lm = cache.get(require_offered(model or offered_models()[0]))
        if isinstance(tree, str) and not tree.lstrip().startswith("[") and tree not in ("default", *lm.trees):
            raise DecodingError(f"unknown tree {tree!r}; known trees: {', '.join(lm.trees)}")
        request = api_request(prompt, lm.name, tree, max_new_tokens=max_new_tokens, acceptance=acceptance,
                              temperature=temperature, seed=int(seed), num_heads=num_heads, method=method,
                              draft_tokens=draft_tokens, lookup_tokens=lookup_tokens, eagle_depth=eagle_depth,
                              eagle_top_k=eagle_top_k, eagle_nodes=eagle_nodes)
        return generate(lm, prompt, decode_settings(lm, request)).to_dict()
    except DecodingError as e:
        raise refusal(e) from e
