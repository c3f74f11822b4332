"""The page's one public API endpoint, `/trace`: a whole run as JSON, under the page's limits."""

from __future__ import annotations

from decoding.drafters import drafter_setting
from decoding.errors import DecodingError
from decoding.measure import generate_on_free_cores
from decoding.settings import DecodeSettings

from .handlers import refusal
from .inputs import PAGE_UNSET, api_request, decode_settings
from .model_thread import on_model_thread
from .models import offered_models, require_offered
from .store import cache

DEFAULTS = DecodeSettings()


def _default(name: str) -> int:
    """A drafter setting's default as the API takes it (PAGE_UNSET where it is unset)."""
    setting = drafter_setting(name)
    return PAGE_UNSET if setting.default is None else setting.default


@on_model_thread
def trace_api(prompt: str, max_new_tokens: int = DEFAULTS.max_new_tokens, acceptance: str = DEFAULTS.acceptance,
              tree: str = "default", num_heads: int = PAGE_UNSET, model: str = "",
              temperature: float = DEFAULTS.temperature, seed: int = -1, method: str = DEFAULTS.method,
              draft_tokens: int = _default("draft_tokens"), lookup_tokens: int = _default("lookup_tokens"),
              eagle_depth: int = _default("eagle_depth"), eagle_top_k: int = _default("eagle_top_k"),
              eagle_nodes: int = PAGE_UNSET) -> dict:
    """Decode `prompt` and return the whole trace as JSON (the schema of decoding.trace).

    `method` is a drafter the model offers (see decoding.drafters) or "ar" (plain decoding);
    `draft_tokens` is the draft model's tokens a round, `lookup_tokens` the most tokens prompt
    lookup copies; an EAGLE run grows its own tree each round, `eagle_depth` levels deep with
    `eagle_top_k` guesses from each of the `eagle_top_k` most confident nodes a level, and
    verifies `eagle_nodes` of them (0: as many as pay here). `tree` is a preset name, "default",
    or a choices list as JSON (Medusa only); `num_heads` 0 uses all heads; `model` "" uses the
    page's default model, and any other value must be a model the page offers; `seed` -1 draws a
    fresh one. The page's limits (decoding.limits) apply, as they do to a visitor's Run.
    """
    try:
        lm = cache.get(require_offered(model or offered_models()[0]))
        request = api_request(prompt, lm.name, tree, max_new_tokens=max_new_tokens, acceptance=acceptance,
                              temperature=temperature, seed=seed, num_heads=num_heads, method=method,
                              draft_tokens=draft_tokens, lookup_tokens=lookup_tokens, eagle_depth=eagle_depth,
                              eagle_top_k=eagle_top_k, eagle_nodes=eagle_nodes)
        return generate_on_free_cores(lm, prompt, decode_settings(lm, request)).to_dict()
    except DecodingError as e:
        raise refusal(e) from e
