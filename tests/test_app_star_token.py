"""The tree's ★ is the token each round actually wrote after its accepted path, in every
acceptance mode: the next round's root. (It used to be the base model's argmax, which is wrong
whenever a sampling mode draws another token.)"""

from __future__ import annotations

from itertools import pairwise

import pytest

from app.tokens import figure_text
from app.tree_figures import tree_figure
from decoding.loops import generate
from decoding.settings import DecodeSettings


def _star_text(trace, rnd) -> str:
    (star,) = [t for t in tree_figure(trace.tree, rnd).data if (t.name or "").startswith("next token")]
    return star.text[0]


@pytest.mark.parametrize("acceptance, temperature", [("greedy", 1.0), ("typical", 1.2), ("sample", 1.2)])
def test_the_star_is_the_next_rounds_root(tiny_llama, acceptance, temperature):
    settings = DecodeSettings(max_new_tokens=40, acceptance=acceptance, temperature=temperature, seed=3)
    trace = generate(tiny_llama, "It is a truth universally", settings)
    assert len(trace.rounds) >= 5
    for rnd, following in pairwise(trace.rounds):
        assert rnd.next_token == following.root_token
        assert rnd.emitted_tokens[-1] == rnd.next_token  # written, as the round's last token
        assert _star_text(trace, rnd) == figure_text(tiny_llama.token_text(following.root_token), 10)


def test_sampling_does_draw_tokens_other_than_the_argmax(tiny_llama):
    """The case the old star got wrong exists: the chosen token differs from the argmax."""
    settings = DecodeSettings(max_new_tokens=60, acceptance="sample", temperature=1.5, seed=0)
    trace = generate(tiny_llama, "It is a truth universally", settings)
    differing = [r for r in trace.rounds if r.next_token != r.base_argmax_tokens[r.accepted_nodes[-1]]]
    assert differing
    for rnd in differing:
        assert _star_text(trace, rnd) == figure_text(rnd.next_text, 10)
