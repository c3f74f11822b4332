"""The page's one public API endpoint, `/trace`: a whole run as JSON, under the page's limits."""

from __future__ import annotations

from decoding.errors import DecodingError
from decoding.measure import generate_on_free_cores

from .handlers import refusal
from .inputs import decode_settings, trace_request
from .model_thread import on_model_thread
from .models import offered_models, require_offered
from .store import cache


@on_model_thread
def trace_api(prompt: str, settings: dict | None = None) -> dict:
    """Decode `prompt` and return the whole trace as JSON (the schema of decoding.trace).

    `settings` names what to change from the defaults (app.inputs.TRACE_SETTINGS and each
    drafter's own settings, as `python -m decoding generate --help` lists them), e.g.
    `{"model": "smollm2", "max_new_tokens": 32, "acceptance": "sample", "seed": 1}`. A setting
    left out or null takes its default: the page's default model, the drafter `medusa`, the tree
    "auto" (a tree's name, or a choices list as JSON text), a fresh random seed. `method` is a
    drafter the model offers or "ar" (plain decoding). The page's limits (decoding.limits) apply,
    as they do to a visitor's Run.
    """
    try:
        request = trace_request(prompt, settings)
        lm = cache.get(require_offered(request.model or offered_models()[0]))
        return generate_on_free_cores(lm, prompt, decode_settings(lm, request)).to_dict()
    except DecodingError as e:
        raise refusal(e) from e
