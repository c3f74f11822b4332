"""Token text for display: visible whitespace for labels, coloured HTML for the output stream."""

from __future__ import annotations

import html
import re

from decoding.stats import round_end_times
from decoding.trace import RoundTrace, RunTrace

from .lanes import guess_name, who_guessed
from .palette import BASE, HEADS, head_colour

# Whitespace is invisible on a figure; these stand-ins make " the" and "the" look different.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}



def count(number: int, noun: str, plural: str | None = None) -> str:
    """"1 token", "3 tokens": a number with its noun, in the plural where it needs one
    (`plural`: where adding an s does not make it)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"

def visible(text: str) -> str:
    """The token with its whitespace drawn, e.g. ' the' -> '␣the', '\\n' -> '↵'."""
    return "".join(_VISIBLE.get(ch, ch) for ch in text) if text else "∅"


def token_label(text: str, max_chars: int = 10) -> str:
    """A short label for a crowded figure; the full token goes in the hover text."""
    shown = visible(text)
    return shown if len(shown) <= max_chars else shown[: max_chars - 1] + "…"


def figure_text(text: str, max_chars: int | None = None) -> str:
    """A token for a Plotly label or hover: whitespace drawn, shortened to `max_chars` if given,
    and `<`, `>`, `&` escaped, because Plotly reads a few HTML tags in text (a "<br>" token would
    otherwise break the line)."""
    shown = token_label(text, max_chars) if max_chars else visible(text)
    return html.escape(shown, quote=False)


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~>-])")


def _code_char(ch: str) -> str:
    """One character of a code span: `<`, `>`, `&` as HTML entities, Markdown syntax as numeric
    entities, anything else (quotes included: this is element text, not an attribute) as itself.
    Escaping character by character keeps one escape from being escaped again (`'` once showed
    as `&#x27;`)."""
    if ch in "<>&":
        return html.escape(ch)
    return f"&#{ord(ch)};" if _MARKDOWN_SPECIAL.fullmatch(ch) else ch


def md_code(text: str, max_chars: int | None = None) -> str:
    """A token inside Markdown, as an HTML code span: whitespace drawn, everything escaped, so
    no token (backticks, `<img ...>`, `**`) can change the page around it."""
    shown = token_label(text, max_chars) if max_chars else visible(text)
    return f"<code>{''.join(_code_char(ch) for ch in shown)}</code>"


def md_text(text: str) -> str:
    """Visitor text shown as itself inside Markdown: HTML escaped, Markdown syntax neutralised."""
    one_line = " ".join(text.split())
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(one_line, quote=False))


def _token_span(text: str, depth: int, method: str, end: bool = False) -> str:
    """One token: coloured by who produced it (depth 0 = the base model, d = the drafter's
    guess d places after the root: Medusa's head d, the draft model's d-th step, a copy). The
    model's end-of-text token (`end`) is a marker, not text: its raw name (`<|im_end|>`) means
    nothing to a reader, and the hover gives it."""
    colour = head_colour(depth)
    kind = "base model" if depth == 0 else f"{guess_name(method, depth)} guess, accepted"
    shown = html.escape(text.replace("\n", "↵"))  # a line break here would make its box two lines tall
    if end:
        kind, shown = f"{kind}: the model's end-of-text token {html.escape(text)}", "⏹ end of text"
    return (
        f'<span class="tok {"tok-base" if depth == 0 else "tok-guess"}{" tok-end" if end else ""}" '
        f'style="--tok:{colour}" title="{kind}">{shown}</span>'
    )


def _pass_span(rnd: RoundTrace, current: int | None, method: str, ends: bool = False) -> str:
    """One round's tokens in a box; `data-round` lets a click on it select that round; `ends`:
    its last token is the model's end of text."""
    guessed = sum(rnd.emitted_from_drafter)
    last = len(rnd.emitted_texts) - 1
    spans = "".join(_token_span(text, depth + 1 if from_head else 0, method, end=ends and depth == last)
                    for depth, (text, from_head) in enumerate(zip(rnd.emitted_texts, rnd.emitted_from_drafter,
                                                                  strict=True)))
    title = f"round {rnd.index + 1}: {count(rnd.accepted_length, 'token')}, {guessed} from {who_guessed(method)}"
    mark = " current" if rnd.index == current else ""
    return (f'<span class="pass{mark}" data-round="{rnd.index + 1}" title="{title}">{spans}</span>'
            f"{_line_break_after(rnd.emitted_texts)}")


def _line_break_after(texts: list[str]) -> str:
    """A pass that wrote a line break shows it as ↵ in its box and breaks the stream's line after
    the box: the box stays one line tall, so every line of the stream is (style.css's whole-line
    scrolling needs it). A blank line is one break too: the box of four lines keeps its text."""
    return "\n" if any("\n" in text for text in texts) else ""


def stream_html(trace: RunTrace | None, until: float | None = None, show_prompt: bool = True,
                caret: bool = False, current: int | None = None) -> str:
    """The run's output as HTML, one box per forward pass, tokens coloured by their source.

    `until` (decoding seconds since the run's start) keeps only what had been produced by then:
    the race replays a measured run with it. `current` (a round index) marks that round's box.
    """
    if trace is None:
        return '<div class="stream stream-empty">Press <b>Run</b> to generate.</div>'
    parts, method = [], trace.settings.method
    if show_prompt:
        parts.append(f'<span class="prompt">{html.escape(trace.prompt)}</span>')
    ended = trace.stop_reason == "eos"  # then the run's last token is the model's end of text
    if trace.prefill_token is not None and (until is None or trace.time_prefill <= until):
        parts.append('<span class="pass" title="prefill pass: the base model reads the prompt">'
                     f"{_token_span(trace.prefill_text, 0, method, end=ended and not trace.rounds)}</span>"
                     f"{_line_break_after([trace.prefill_text])}")
    for end, rnd in zip(round_end_times(trace), trace.rounds, strict=True):
        if until is not None and end > until:
            break
        parts.append(_pass_span(rnd, current, method, ends=ended and rnd is trace.rounds[-1]))
    if caret:
        parts.append('<span class="caret">▍</span>')
    return f'<div class="stream">{"".join(parts)}</div>'


def legend_html(method: str, depth: int) -> str:
    """The key to the stream's colours: the base model, then the drafter's guesses by depth."""
    items = [f'<span class="key" style="--tok:{BASE}">base model (1 per pass)</span>']
    items += [
        f'<span class="key" style="--tok:{head_colour(d)}">{guess_name(method, d)}</span>'
        for d in range(1, min(depth, len(HEADS)) + 1)
    ]
    if depth > len(HEADS):  # a long lookup chain: the colours start again
        items.append(f'<span class="key-note">… to {guess_name(method, depth)}, colours repeating</span>')
    note = '<span class="key-note">a box = one forward pass (click it for its round)</span>'
    return f'<div class="legend">{"".join(items)}{note}</div>'
