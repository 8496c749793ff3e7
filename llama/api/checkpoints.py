"""Context checkpoints for memories that cannot drop their last tokens (llama-server's
`--ctx-checkpoints`, tools/server/server-context.cpp): a recurrent state holds every token
of its sequence, so a prompt that shares only a prefix of what a sequence holds could not
keep any of it. Instead, while a prompt is decoded, its decode pauses 4 + n_ubatch and 4
tokens before its end and a copy of the sequence's recurrent states is kept there; a
later prompt that extends one of those points resumes from the newest such copy and
decodes only the tokens after it (a second chat turn re-reads its own last few tokens,
not the conversation). At most `n_max` are kept per sequence, the oldest dropped first;
llama-server's further checkpoints at the start of user messages are not taken.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llama.recurrent import RSSeqState

DEFAULT_MAX = 32   # llama-server's n_ctx_checkpoints
END_OFFSET = 4     # the last pause: this many tokens before the prompt's end (the other adds n_ubatch)


@dataclass(frozen=True)
class Checkpoint:
    n_tokens: int        # the prompt tokens the state covers
    state: RSSeqState


@dataclass
class Checkpoints:
    n_seq: int
    n_max: int = DEFAULT_MAX
    by_seq: list[list[Checkpoint]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_seq = [[] for _ in range(self.n_seq)]

    @staticmethod
    def stops(n_prompt: int, n_done: int, n_batch: int, n_ubatch: int) -> list[int]:
        """Where a prompt's decode pauses for a checkpoint: llama-server's offsets before
        the end (each at most n_batch), those past what is already decoded."""
        offsets = (END_OFFSET + n_ubatch, END_OFFSET)
        return sorted({n_prompt - min(n_batch, off) for off in offsets if n_prompt - min(n_batch, off) > n_done})

    def save(self, seq_id: int, n_tokens: int, state: RSSeqState) -> None:
        """A checkpoint after n_tokens (one at the same point is replaced)."""
        if self.n_max <= 0:
            return
        kept = [c for c in self.by_seq[seq_id] if c.n_tokens != n_tokens]
        while len(kept) >= self.n_max:
            kept.pop(0)
        kept.append(Checkpoint(n_tokens, state))
        self.by_seq[seq_id] = kept

    def newest_within(self, seq_id: int, n_prefix: int) -> Checkpoint | None:
        """The newest checkpoint covering no more than the first n_prefix tokens."""
        for c in reversed(self.by_seq[seq_id]):
            if 0 < c.n_tokens <= n_prefix:
                return c
        return None

    def drop_after(self, seq_id: int, n_tokens: int) -> None:
        """Checkpoints past n_tokens no longer describe the sequence (llama-server erases
        them when the cache is cut there)."""
        self.by_seq[seq_id] = [c for c in self.by_seq[seq_id] if c.n_tokens <= n_tokens]
