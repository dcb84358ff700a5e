"""A slow, plain beam search written for clarity, to check the fast batched generator against.

One sentence at a time, one step at a time, a full forward pass over the whole prefix each step (no cache), Python
lists for hypotheses and candidates. The rules are fairseq's, stated once here in the simplest form:

- every hypothesis starts from the start token (EOS); step s picks output token s+1;
- log-probabilities: log_softmax(logits / temperature); pad is never chosen; unk pays `unk_penalty`;
  at step == max_len only EOS is allowed; below min_len EOS is not allowed; with no_repeat_ngram_size = n a token
  that would repeat an n-gram of the prefix (start token included) is not allowed;
- candidates are (cumulative score, hypothesis, token); take the best 2*beam (at step 0 only the single start
  hypothesis exists);
- an EOS candidate ranked among the first `beam` finishes a hypothesis (while the sentence has fewer than `beam`),
  scored cumulative / (step + 1) ** len_penalty; the first `beam` non-EOS candidates continue;
- stop once `beam` hypotheses finished or step == max_len, where
  max_len = min(int(max_len_a * source length + max_len_b), max_target_positions - 1);
- return the finished hypotheses sorted by score (stable), best first.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _banned(prefix: list[int], n: int) -> list[int]:
    if n <= 0:
        return []
    if n == 1:
        return prefix[1:]
    tail = prefix[len(prefix) - n + 1 :]
    return [prefix[i + n - 1] for i in range(len(prefix) - n + 1) if prefix[i : i + n - 1] == tail]


@torch.no_grad()
def reference_beam_search(
    model,
    source: list[int],
    beam: int,
    pad: int = 1,
    eos: int = 2,
    unk: int = 3,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    min_len: int = 1,
    len_penalty: float = 1.0,
    unk_penalty: float = 0.0,
    no_repeat_ngram_size: int = 0,
    temperature: float = 1.0,
    nbest: int = 1,
) -> list[dict]:
    """`source`: the sentence's token ids (no padding). Returns [{"tokens": [...], "score": float,
    "positional_scores": [...]}] best first."""
    model.eval()
    src = torch.tensor([source])
    max_len = min(int(max_len_a * len(source) + max_len_b), model.max_positions()[1] - 1)

    # a hypothesis: (tokens including the start token, cumulative score as a float32 tensor, per-token scores)
    live = [([eos], torch.tensor(0.0), [])]
    finished: list[dict] = []
    for step in range(max_len + 1):
        candidates = []
        for h, (prefix, total, _per_token) in enumerate(live):
            logits, _ = model(src, torch.tensor([len(source)]), torch.tensor([prefix]))
            lprobs = F.log_softmax(logits[0, -1].float() / temperature, dim=-1)
            lprobs[pad] = -math.inf
            lprobs[unk] -= unk_penalty
            if step >= max_len:
                keep = lprobs[eos].clone()
                lprobs[:] = -math.inf
                lprobs[eos] = keep
            elif step < min_len:
                lprobs[eos] = -math.inf
            for tok in _banned(prefix, no_repeat_ngram_size):
                lprobs[tok] = -math.inf
            for tok in range(lprobs.numel()):
                score = total + lprobs[tok]
                if score.item() > -math.inf:
                    candidates.append((score, h, tok, lprobs[tok]))
        # best first; ties keep the (hypothesis, token) order
        candidates.sort(key=lambda c: -c[0].item())
        candidates = candidates[: 2 * beam]

        next_live = []
        for rank, (score, h, tok, lp) in enumerate(candidates):
            prefix, _, per_token = live[h]
            if tok == eos:
                if rank < beam and len(finished) < beam:
                    finished.append(
                        {
                            "tokens": prefix[1:] + [eos],
                            "score": score.item() / (step + 1) ** len_penalty,
                            "positional_scores": per_token + [lp.item()],
                        }
                    )
            elif len(next_live) < beam:
                next_live.append((prefix + [tok], score, per_token + [lp.item()]))
        if len(finished) >= beam or step >= max_len:
            break
        live = next_live
    finished.sort(key=lambda f: -f["score"])
    return finished[:nbest]


def fairseq_forced_eos(max_length: int, eos: int):
    """A transformers LogitsProcessor forcing EOS at `max_length` the way fairseq does: every other token gets
    -inf and EOS keeps its log-prob (transformers' forced_eos_token_id would give it 0). scripts/bench/bench_generate.py
    has the same processor for its comparison."""
    import transformers

    class ForceEosKeepScore(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[-1] == max_length - 1:
                kept = scores[:, eos].clone()
                scores = torch.full_like(scores, -math.inf)
                scores[:, eos] = kept
            return scores

    return ForceEosKeepScore()
