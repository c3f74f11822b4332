"""Deciding which guesses to keep: the three acceptance schemes.

Every scheme reads the verify pass's logits: row i is the base model's distribution over the
token that comes *after* node i. A child c of node i is therefore judged by row i. Each scheme
returns the accepted path (node indices, root first) and the next root token, which comes from the
row of the last accepted node — a token the base model produced for free in the same pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .tree import Tree


@dataclass
class Verdict:
    accepted_nodes: list[int]
    next_token: int


def sampling_distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Softmax at `temperature`, keeping only the top-p nucleus. Float32, rows sum to 1.

    Plain sampling and speculative sampling both draw from exactly this distribution, which is
    what makes the comparison between them meaningful.
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the tokens ranked above it already cover top_p.
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def greedy_accept(tree: Tree, node_tokens: list[int], logits: torch.Tensor) -> Verdict:
    """Follow the child whose token is the base model's argmax; stop where no child matches.

    Each accepted token is exactly the token plain greedy decoding would have written at that
    position, because the tree mask made the verify pass see precisely that prefix.
    """
    best = logits.argmax(dim=-1).tolist()
    path = [0]
    while True:
        node = path[-1]
        match = next((c for c in tree.children[node] if node_tokens[c] == best[node]), None)
        if match is None:
            return Verdict(path, best[node])
        path.append(match)


def typical_accept(
    tree: Tree,
    node_tokens: list[int],
    logits: torch.Tensor,
    temperature: float,
    epsilon: float,
    delta: float,
    generator: torch.Generator,
) -> Verdict:
    """Medusa's typical acceptance: keep a guess the base model finds plausible enough.

    A child token x of node i passes when p_i(x) > min(epsilon, delta * exp(-H(p_i))): a fixed
    bar, lowered when the model is unsure (high entropy H). Of all passing paths the longest
    wins, ties going to the higher summed log-probability. Fast, but not the base distribution.
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1).cpu()
    entropy = -(probs * torch.log(probs.clamp_min(1e-12))).sum(dim=-1)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    best_path, best_key = [0], (0, 0.0)
    stack = [([0], 0.0)]
    while stack:
        path, logp = stack.pop()
        node = path[-1]
        key = (len(path) - 1, logp)
        if key > best_key:
            best_path, best_key = path, key
        for child in tree.children[node]:
            p = probs[node, node_tokens[child]].item()
            if p > threshold[node].item():
                stack.append((path + [child], logp + math.log(p)))
    last = best_path[-1]
    # The next root is sampled from the typical set of the last node, as the reference does.
    row = probs[last].clone()
    row[row <= threshold[last]] = 0.0
    if row.sum() == 0:
        row = probs[last]
    return Verdict(best_path, int(torch.multinomial(row, 1, generator=generator)))


def speculative_accept(
    tree: Tree,
    node_tokens: list[int],
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
) -> Verdict:
    """Rejection sampling over the tree: the output has exactly the base model's distribution.

    At a node with distribution p, try its children x1, x2, ... in rank order. The heads' guesses
    are deterministic (a point mass on each), so the usual test min(1, p(x)/q(x)) becomes: accept
    x_j with probability r(x_j) / sum(r), where r is p with the earlier rejected siblings zeroed.
    If all are rejected, sample from what is left of r. Summing over the ways to reach a token y
    gives P(y) = p(y) for every y, guessed or not, so nothing about the draft leaks into the
    output. Accepting a child moves the test one level down, with the child's own distribution.
    """
    path = [0]
    while True:
        node = path[-1]
        residual = sampling_distribution(logits[node], temperature, top_p).cpu()
        for child in tree.children[node]:
            token = node_tokens[child]
            total = residual.sum()
            if total > 0 and torch.rand(1, generator=generator).item() < residual[token] / total:
                path.append(child)
                break
            residual[token] = 0.0
        else:
            return Verdict(path, int(torch.multinomial(residual, 1, generator=generator)))
