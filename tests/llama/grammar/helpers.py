"""Test helpers: the mask a GrammarSampler applies, and walking a text through it."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from llama.grammar import GrammarSampler
from llama.sampling import Candidates
from llama.vocab import Vocab


def applied_mask(sampler: GrammarSampler, n_vocab: int) -> np.ndarray:
    """Which tokens keep a finite logit after `apply` on a full candidate list."""
    cur = Candidates.from_logits(np.zeros(n_vocab, dtype=np.float32))
    sampler.apply(cur)
    assert (cur.ids == np.arange(n_vocab)).all()
    return np.isfinite(cur.logits)


class PieceIndex:
    """Token ids by their bytes, to find the tokens that spell a given text."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.pieces = [vocab.token_to_piece(t, special=True) for t in range(vocab.n_vocab)]
        self.by_bytes: dict[bytes, list[int]] = defaultdict(list)
        for tid, piece in enumerate(self.pieces):
            if piece and tid not in vocab.eog_ids:
                self.by_bytes[piece].append(tid)
        self.max_len = max(len(p) for p in self.pieces)

    def walk(self, sampler: GrammarSampler, text: str) -> bool:
        """Feed `text` through apply/accept, at each step taking the longest allowed token
        that spells the next bytes; True if the whole text is allowed and may end there.

        llguidance works on bytes, so which tokens spell a text does not change the state;
        only its forced-token shortcut narrows the mask, and it keeps the text reachable.
        """
        data, pos = text.encode("utf-8"), 0
        eog = sorted(self.vocab.eog_ids)
        while pos < len(data):
            allowed = applied_mask(sampler, self.vocab.n_vocab)
            choice = None
            for n in range(min(self.max_len, len(data) - pos), 0, -1):
                ok = [t for t in self.by_bytes.get(data[pos:pos + n], []) if allowed[t]]
                if ok:
                    choice = ok[0]
                    break
            if choice is None:
                return False
            sampler.accept(choice)
            pos += len(self.pieces[choice])
        return bool(applied_mask(sampler, self.vocab.n_vocab)[eog].all())
