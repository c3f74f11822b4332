"""The round loops: plain autoregressive decoding and speculative decoding, traced the same way.

    prompt ─ prefill ─▶ root token ─┐
                                    ▼
        ┌─ draft:   guess the next few tokens: Medusa's heads (top-k each), a draft model's
        │           chain, or a copy from earlier in the text          (no base-model pass)
        │  verify:  ONE pass over the whole tree of guesses, tree mask  (the only base pass)
        │  accept:  keep the longest path the base model agrees with, plus its own next token
        └─ compact: keep only the accepted rows in the KV cache ◀───────┘

Both loops are generators that yield the growing RunTrace after prefill and after every round,
so a UI can stream; `generate` runs one to the end. Time spent by the consumer between yields is
not counted: the clock only runs inside the loop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import torch
from transformers import PreTrainedTokenizerBase

from .acceptance import Verdict, greedy_accept, sampling_distribution, speculative_accept, typical_accept
from .drafters import Drafter, Proposal, check_settings, make_drafter
from .dynamic_tree import DYNAMIC_TREE
from .errors import DecodingError
from .kv_cache import compact_cache, new_cache
from .memory import check_fits
from .model import LoadedModel
from .passes import decode_one_token, prefill, verify_tree
from .settings import PLAIN, DecodeSettings
from .trace import RoundTrace, RunTrace
from .tree import Tree


class Stopwatch:
    """Wall-clock time that only runs between `resume()` and `pause()`; syncs CUDA when read."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.elapsed = 0.0
        self._since: float | None = None

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def resume(self) -> None:
        self._since = self.now()

    def pause(self) -> None:
        if self._since is not None:
            self.elapsed += self.now() - self._since
            self._since = None

    def read(self) -> float:
        """Seconds counted so far, the running segment included."""
        return self.elapsed + (self.now() - self._since if self._since is not None else 0.0)


# ----- inputs -----
def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A chat model's input for one user turn: the tokenizer's own chat template, ending with the
    cue for the assistant's answer. The trace keeps the user's text; only the model sees this."""
    messages = [{"role": "user", "content": text}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])


def encode_prompt(lm: LoadedModel, prompt: str) -> list[int]:
    if not isinstance(prompt, str):
        raise DecodingError(f"the prompt must be text (a str), not {type(prompt).__name__}")
    if not prompt.strip():
        raise DecodingError("the prompt is empty: type some text to continue")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        # Python keeps bytes of a command line that are not UTF-8 as lone surrogates.
        raise DecodingError(f"the prompt is not valid UTF-8 text (character {e.start} of it): "
                            "write it in UTF-8") from e
    if lm.use_chat_template:
        ids = chat_prompt_ids(lm.tokenizer, prompt)
    else:
        ids = lm.tokenizer(lm.prompt_template.format(prompt=prompt)).input_ids
    if len(ids) >= lm.context_length:
        raise DecodingError(
            f"the prompt is {len(ids)} tokens but {lm.name} reads at most "
            f"{lm.context_length}: shorten it"
        )
    return list(ids)


def choose_token(logits: torch.Tensor, settings: DecodeSettings, generator: torch.Generator) -> int:
    """The base model's own choice from one row of logits: argmax, or a sample."""
    if settings.acceptance == "greedy":
        return int(logits.argmax())
    probs = sampling_distribution(logits, settings.temperature, settings.top_p).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def accept(
    tree: Tree, node_tokens: list[int], logits: torch.Tensor,
    settings: DecodeSettings, generator: torch.Generator,
) -> Verdict:
    if settings.acceptance == "greedy":
        return greedy_accept(tree, node_tokens, logits)
    if settings.acceptance == "typical":
        return typical_accept(tree, node_tokens, logits, settings.temperature,
                              settings.epsilon, settings.delta, generator)
    return speculative_accept(tree, node_tokens, logits, settings.temperature, settings.top_p, generator)


def _new_trace(lm: LoadedModel, prompt: str, prompt_ids: list[int], settings: DecodeSettings,
               drafter: Drafter | None) -> RunTrace:
    """The trace of a run about to start: its settings as run, the tree verified named, and only
    its own drafter's options, resolved."""
    tree = None if drafter is None else drafter.tree.name if drafter.tree is not None else DYNAMIC_TREE
    recorded = dataclasses.replace(settings, tree=tree,
                                   options={} if drafter is None else drafter.recorded_options(settings))
    return RunTrace(
        model=lm.name, device=str(lm.device), dtype=str(lm.dtype).removeprefix("torch."),
        settings=recorded, prompt=prompt, prompt_tokens=prompt_ids,
        tree=None if drafter is None or drafter.tree is None else drafter.tree.to_trace(),
        detailed=settings.detailed_trace,
        dtype_reason=lm.dtype_reason, cost_curve=lm.cost_curve,
    )


def _make_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _cut_at_stop(lm: LoadedModel, tokens: list[int], produced: int, limit: int) -> tuple[list[int], str]:
    """Trim a round's new tokens at an end-of-sequence token or at the token budget."""
    kept: list[int] = []
    for token in tokens:
        if produced + len(kept) >= limit:
            return kept, "max_new_tokens"
        kept.append(token)
        if token in lm.eos_token_ids:
            return kept, "eos"
    return kept, "max_new_tokens" if produced + len(kept) >= limit else ""


def _start(lm: LoadedModel, trace: RunTrace, clock: Stopwatch, logits: torch.Tensor,
           settings: DecodeSettings, generator: torch.Generator) -> int:
    """Record the prefill's token; returns it."""
    token = choose_token(logits, settings, generator)
    trace.prefill_token, trace.prefill_text = token, lm.token_text(token)
    trace.time_prefill = clock.read()
    if token in lm.eos_token_ids:
        trace.stop_reason = "eos"
    elif settings.max_new_tokens <= 1:
        trace.stop_reason = "max_new_tokens"
    return token


def _check_fits(lm: LoadedModel, prompt_ids: list[int], settings: DecodeSettings, tree_nodes: int) -> None:
    """Refuse, before any pass, a run that would not fit in the memory the device has free."""
    context = min(len(prompt_ids) + settings.max_new_tokens, lm.context_length)
    check_fits(lm.model.config, lm.device, lm.dtype, tree_nodes, context)


def _out_of_time(trace: RunTrace, clock: Stopwatch, settings: DecodeSettings) -> bool:
    """Whether the run has used up its time limit (it then stops with what it wrote)."""
    if settings.time_limit is None or clock.read() < settings.time_limit:
        return False
    trace.stop_reason = "time_limit"
    return True


def _hand_over(trace: RunTrace, clock: Stopwatch) -> Iterator[RunTrace]:
    """Yield the trace to the consumer with the clock stopped: its time is not decoding time."""
    clock.pause()
    yield trace
    clock.resume()


# ----- plain autoregressive decoding -----
@torch.inference_mode()
def autoregressive_decode(lm: LoadedModel, prompt: str, settings: DecodeSettings) -> Iterator[RunTrace]:
    """One pass per token: the baseline every drafter must match (greedy) and beat (speed)."""
    settings = _checked(lm, settings)
    prompt_ids = encode_prompt(lm, prompt)
    _check_fits(lm, prompt_ids, settings, tree_nodes=1)
    trace = _new_trace(lm, prompt, prompt_ids, settings, drafter=None)
    generator = _make_generator(settings.seed)
    clock = Stopwatch(lm.device)
    clock.resume()
    cache = new_cache(lm.model.config)
    logits, _ = prefill(lm, prompt_ids, cache)
    token = _start(lm, trace, clock, logits, settings, generator)
    produced = 1
    yield from _hand_over(trace, clock)
    while not trace.stop_reason:
        if _out_of_time(trace, clock, settings):
            break
        if cache.get_seq_length() + 1 > lm.context_length:
            trace.stop_reason = "context_limit"
            break
        start = clock.read()
        logits = decode_one_token(lm, token, cache)
        verified = clock.read()
        token = choose_token(logits, settings, generator)
        kept, trace.stop_reason = _cut_at_stop(lm, [token], produced, settings.max_new_tokens)
        produced += len(kept)
        done = clock.read()
        trace.rounds.append(RoundTrace(
            index=len(trace.rounds), position=len(prompt_ids) + produced - 1,
            emitted_tokens=kept, emitted_texts=[lm.token_text(t) for t in kept],
            emitted_from_drafter=[False] * len(kept),
            time_draft=0.0, time_verify=verified - start, time_accept=done - verified,
            t_end=clock.read(),
        ))
        yield from _hand_over(trace, clock)
    trace.total_time = clock.read()
    clock.pause()
    yield trace


# ----- speculative decoding: any drafter -----
def _detail(lm: LoadedModel, drafter: Drafter, round_trace: RoundTrace, proposal: Proposal,
            logits: torch.Tensor, accepted: list[int], root: int) -> None:
    """Fill in what the UI shows for a round: the drafter's guesses, and the base model at every node."""
    tree, node_tokens = proposal.tree, proposal.tokens
    # Probabilities from log-sum-exp: no (T, V) softmax table is built just to read T numbers.
    logits = logits.float()
    log_norm = logits.logsumexp(dim=-1)
    best_logits, base_tokens = logits.max(dim=-1)
    base_probs = torch.exp(best_logits - log_norm)
    parents = torch.tensor(tree.parents[1:], dtype=torch.long, device=logits.device)
    node_probs = torch.exp(logits[parents, node_tokens[1:]] - log_norm[parents])
    # One transfer to the CPU for everything, rather than one per number.
    tokens, best, best_p, node_p = (x.cpu().tolist() for x in (node_tokens, base_tokens, base_probs, node_probs))
    round_trace.root_token = root
    if proposal.guesses is not None:
        round_trace.guesses = proposal.guesses.cpu().tolist()
    if proposal.guess_probs is not None:
        round_trace.guess_probs = proposal.guess_probs.cpu().tolist()
    round_trace.node_tokens, round_trace.node_texts = tokens, [lm.token_text(t) for t in tokens]
    round_trace.node_sources = ["base"] + [drafter.name] * (len(tokens) - 1)
    round_trace.node_origins = list(proposal.origins or [])
    round_trace.drafting_note = proposal.note
    round_trace.node_base_probs = [None] + node_p
    round_trace.base_argmax_tokens = best
    round_trace.base_argmax_texts = [lm.token_text(t) for t in best]
    round_trace.base_argmax_probs = best_p
    round_trace.accepted_nodes = accepted
    if drafter.tree is None:  # a tree grown for this round alone
        round_trace.tree = tree.to_trace()
        if proposal.drafted is not None:
            round_trace.drafted = dataclasses.replace(
                proposal.drafted, texts=[lm.token_text(t) for t in proposal.drafted.tokens])


@torch.inference_mode()
def speculative_decode(lm: LoadedModel, prompt: str, settings: DecodeSettings) -> Iterator[RunTrace]:
    """Draft a tree of guesses, verify it in one pass, accept, compact; repeat. Any drafter."""
    settings = _checked(lm, settings)
    if settings.method == PLAIN:
        raise DecodingError("speculative decoding needs a drafter: name one as the method, or decode plainly")
    prompt_ids = encode_prompt(lm, prompt)
    drafter = make_drafter(lm, settings)
    _check_fits(lm, prompt_ids, settings, drafter.max_tree_nodes)
    trace = _new_trace(lm, prompt, prompt_ids, settings, drafter)
    generator = _make_generator(settings.seed)
    clock = Stopwatch(lm.device)
    clock.resume()
    cache = new_cache(lm.model.config, for_trees=True)
    logits, prompt_states = prefill(lm, prompt_ids, cache, hidden_layers=drafter.hidden_layers)
    hidden = None if prompt_states is None else prompt_states[-1]
    drafter.begin(prompt_ids, prompt_states)
    root = _start(lm, trace, clock, logits, settings, generator)
    produced = 1
    trace.drafter = drafter.info()
    yield from _hand_over(trace, clock)
    while not trace.stop_reason:
        if _out_of_time(trace, clock, settings):
            break
        past = cache.get_seq_length()
        # The root takes position `past` and a node at depth d position past + d. Near the end of
        # the context only the shallower nodes fit; plain decoding stops where no position is left.
        room = lm.context_length - past
        if room < 1:
            trace.stop_reason = "context_limit"
            break
        start = clock.read()
        # Medusa's heads read the hidden state of the token *before* the root (the one whose
        # logits chose the root), so head k guesses the token k places after the root.
        proposal = drafter.propose(root, hidden, room - 1, settings.detailed_trace)
        drafted = clock.read()
        logits, hidden_all = verify_tree(lm, proposal.tree, proposal.tokens, cache, hidden_layers=drafter.hidden_layers)
        verified = clock.read()
        node_list = proposal.tokens.tolist()
        verdict = accept(proposal.tree, node_list, logits, settings, generator)
        compact_cache(cache, past, verdict.accepted_nodes)
        # The next round's heads read the hidden state at the last accepted node: the very
        # position whose logits chose the next root. No extra pass is needed.
        hidden = None if hidden_all is None else hidden_all[verdict.accepted_nodes[-1]]
        written = [node_list[n] for n in verdict.accepted_nodes]
        drafter.advance(written, None if hidden_all is None else hidden_all[verdict.accepted_nodes])
        accepted_done = clock.read()
        new_tokens = written[1:] + [verdict.next_token]
        kept, trace.stop_reason = _cut_at_stop(lm, new_tokens, produced, settings.max_new_tokens)
        produced += len(kept)
        round_trace = RoundTrace(
            index=len(trace.rounds), position=past,
            emitted_tokens=kept, emitted_texts=[lm.token_text(t) for t in kept],
            emitted_from_drafter=[i < len(new_tokens) - 1 for i in range(len(kept))],
            time_draft=drafted - start, time_verify=verified - drafted,
            time_accept=accepted_done - verified, t_end=0.0,
            draft_passes=proposal.draft_passes,
            next_token=verdict.next_token, next_text=lm.token_text(verdict.next_token),
        )
        if settings.detailed_trace:
            _detail(lm, drafter, round_trace, proposal, logits, verdict.accepted_nodes, root)
        round_trace.t_end = clock.read()
        round_trace.time_trace = round_trace.t_end - accepted_done
        trace.rounds.append(round_trace)
        root = verdict.next_token
        yield from _hand_over(trace, clock)
    trace.total_time = clock.read()
    clock.pause()
    trace.drafter = drafter.info()  # again: a draft model's cache has grown since the start
    yield trace


def _checked(lm: LoadedModel, settings: DecodeSettings) -> DecodeSettings:
    """What every decoder checks before any pass: its arguments' types, and the settings."""
    if not isinstance(lm, LoadedModel):
        raise DecodingError(f"decode with a model from load_model(), not {type(lm).__name__}")
    if not isinstance(settings, DecodeSettings):
        raise DecodingError(f"settings must be a DecodeSettings, not {type(settings).__name__}")
    return check_settings(settings)


def stream(lm: LoadedModel, prompt: str, settings: DecodeSettings) -> Iterator[RunTrace]:
    """Yield the run's trace as it grows; the last one yielded has `stop_reason` set."""
    decode = autoregressive_decode if getattr(settings, "method", None) == PLAIN else speculative_decode
    yield from decode(lm, prompt, settings)


def generate(lm: LoadedModel, prompt: str, settings: DecodeSettings) -> RunTrace:
    """Run to the end and return the full trace (the last one `stream` yields)."""
    *_, trace = stream(lm, prompt, settings)
    return trace
