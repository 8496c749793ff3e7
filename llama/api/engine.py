"""Sequences over one `Context`: prompts that reuse the cached prefix, and one decode per
step for the tokens of every generating sequence.

The engine remembers, per sequence id, which tokens its KV cells hold. A new prompt for a
sequence keeps the longest common prefix and decodes only the rest (a second chat turn
re-reads nothing it has seen), as llama-cpp-python and llama-server's `cache_prompt` do. The
last prompt token is always decoded again when everything else is cached, because its
logits are needed. With sliding-window layers the prefix is kept only while the window
still holds the positions the next token attends to (llama-server's rule). A hybrid model's
recurrent states cannot drop tokens: there a prompt resumes from a context checkpoint
(llama/api/checkpoints.py) or is decoded from its start.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from llama.api.checkpoints import DEFAULT_MAX, Checkpoints
from llama.batch import Batch
from llama.context import Context


class DecodeError(RuntimeError):
    """decode failed; the message names the code. The KV cache is left consistent."""

    def __init__(self, rc: int, what: str):
        self.rc = rc
        names = {1: "no KV cache slot", 2: "aborted", -1: "invalid batch"}
        super().__init__(f"decode of the {what} failed with {rc} ({names.get(rc, 'fatal error')})")
        self.rc = rc


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Engine:
    """Decoding for sequences 0 .. ctx.n_seq_max - 1 of one context.

    `n_prompt_decoded` counts the prompt tokens actually decoded (not taken from the cache),
    so tests and benchmarks can see the prefix reuse."""

    def __init__(self, ctx: Context, n_ctx_checkpoints: int = DEFAULT_MAX):
        self.ctx = ctx
        self.cached: list[list[int]] = [[] for _ in range(ctx.n_seq_max)]
        # context checkpoints: only where the memory cannot drop tokens (recurrent states)
        self.checkpoints = Checkpoints(ctx.n_seq_max, n_ctx_checkpoints if ctx.recurrent else 0)
        self.n_prompt_decoded = 0
        self.n_swa = ctx.model.hparams.n_swa if ctx.kv_layout.kv_size_swa else 0
        # speculative drafts being checked: per sequence, its length before and the state
        # to go back to (recurrent memories)
        self._drafts: dict[int, tuple[int, object]] = {}
        # per sequence, the hidden states of its last decoded outputs and the position of
        # the first (contexts that keep them: Context.set_embeddings_nextn)
        self._hidden: dict[int, tuple[int, np.ndarray]] = {}

    def reusable_prefix(self, seq_id: int, tokens: list[int], *, keep_last: bool = True) -> int:
        """How many leading tokens of `tokens` can stay in the cache for this sequence (a
        question only: the caller drops the rest with `forget`)."""
        n = common_prefix(self.cached[seq_id], tokens)
        if keep_last and n == len(tokens):
            n -= 1  # the last prompt token is decoded again for its logits
        # the oldest position still cached is the same before and after dropping those >= n
        if n > 0 and self.n_swa and self.ctx.memory.seq_pos_min(seq_id) > max(0, n - self.n_swa):
            n = 0  # the window no longer holds what the next token attends to
        return max(n, 0)

    def prefill(self, seq_id: int, tokens: list[int], *, logits_all: bool = False,
                reuse: bool = True) -> np.ndarray:
        """Make the cache of `seq_id` hold exactly `tokens`; return the logits of the last
        token ([n_vocab]), or of every decoded token with `logits_all` ([n, n_vocab], the
        prefix is then decoded again too)."""
        if not tokens:
            raise ValueError("the prompt is empty (no tokens)")
        ctx = self.ctx
        keep = self.reusable_prefix(seq_id, tokens) if reuse and not logits_all else 0
        keep = self.forget(seq_id, keep)
        rows = []
        pos = keep
        for end in self._chunk_ends(len(tokens), keep):
            chunk = tokens[pos:end]
            last = end == len(tokens)
            flags = [logits_all or (last and j == len(chunk) - 1) for j in range(len(chunk))]
            batch = Batch(tokens=chunk, pos=list(range(pos, end)), seq_ids=[[seq_id]] * len(chunk), logits=flags)
            rc = ctx.decode(batch)
            if rc != 0:
                self.forget(seq_id, keep)
                raise DecodeError(rc, "prompt")
            self.n_prompt_decoded += len(chunk)
            self.cached[seq_id] = tokens[:end]
            pos = end
            self.after_prompt_chunk(seq_id, len(tokens))
            if logits_all:
                rows.append(np.array(ctx.get_logits()))
            self._keep_hidden(seq_id, end - (len(chunk) if logits_all else 1))
        if logits_all:
            return np.concatenate(rows)
        return ctx.get_logits_ith(-1)

    def set_max_checkpoints(self, n_max: int) -> None:
        """Context checkpoints kept per sequence (llama-server's --ctx-checkpoints); they are
        taken only where the memory cannot drop tokens."""
        if n_max < 0:
            raise ValueError(f"ctx_checkpoints must be >= 0, got {n_max}")
        self.checkpoints.n_max = n_max if self.ctx.recurrent else 0

    def _chunk_ends(self, n_prompt: int, done: int) -> list[int]:
        """Where the prompt's batches end: every n_batch tokens, and at the checkpoints'
        pauses."""
        n_batch = self.ctx.n_batch
        ends = set(range(done + n_batch, n_prompt, n_batch)) | {n_prompt}
        if self.checkpoints.n_max:
            ends |= set(Checkpoints.stops(n_prompt, done, n_batch, self.ctx.n_ubatch))
        return sorted(ends)

    def next_stop(self, seq_id: int, n_prompt: int) -> int:
        """The end of the prompt, or the next checkpoint pause (the server cuts its prompt
        chunks there)."""
        if not self.checkpoints.n_max:
            return n_prompt
        done = len(self.cached[seq_id])
        stops = Checkpoints.stops(n_prompt, done, self.ctx.n_batch, self.ctx.n_ubatch)
        return stops[0] if stops else n_prompt

    def after_prompt_chunk(self, seq_id: int, n_prompt: int) -> None:
        """A prompt chunk of seq_id was decoded: at a checkpoint pause, keep its states."""
        if not self.checkpoints.n_max:
            return
        n = len(self.cached[seq_id])
        if n in Checkpoints.stops(n_prompt, 0, self.ctx.n_batch, self.ctx.n_ubatch):
            self.checkpoints.save(seq_id, n, self.ctx.memory.seq_state(seq_id))

    def decode_step(self, items: list[tuple[int, int]]) -> np.ndarray:
        """One decode of one token for each (seq_id, token); rows of logits in that order."""
        ctx = self.ctx
        if len(items) == 1:
            seq_id, token = items[0]
            batch = Batch.from_tokens([token], seq_id=seq_id)
        else:
            batch = Batch(tokens=[t for _, t in items], seq_ids=[[s] for s, _ in items],
                          logits=[True] * len(items))
        rc = ctx.decode(batch)
        if rc != 0:
            raise DecodeError(rc, "generation")
        for row, (seq_id, token) in enumerate(items):
            self._keep_hidden(seq_id, len(self.cached[seq_id]), row, 1)
            self.cached[seq_id].append(token)
        return ctx.get_logits()

    def decode_mixed(self, items: list[tuple[int, list[int], int]]) -> list[np.ndarray | None]:
        """One decode for several sequences (the server's step): each (seq_id, tokens,
        n_out) appends its tokens to that sequence: a prompt chunk, one generated token, or
        one with a speculative draft after it. Returns, per item, None for n_out 0, the
        logits row of its last token ([n_vocab]) for n_out 1 (or True), and the rows of its
        last n_out tokens ([n_out, n_vocab]) for more. Nothing is recorded for any item when
        the decode fails."""
        if len(items) == 1 and len(items[0][1]) == 1 and int(items[0][2]) == 1:
            return list(self.decode_step([(items[0][0], items[0][1][0])]))  # the one-token fast path
        ctx = self.ctx
        tokens, seq_ids, pos, flags = [], [], [], []
        for seq_id, toks, n_out in items:
            n_out = int(n_out)
            if not 0 <= n_out <= len(toks):
                raise ValueError(f"{n_out} logits rows asked of {len(toks)} tokens")
            start = len(self.cached[seq_id])
            tokens += toks
            seq_ids += [[seq_id]] * len(toks)
            pos += range(start, start + len(toks))
            flags += [False] * (len(toks) - n_out) + [True] * n_out
        if len(tokens) > ctx.n_batch:
            raise ValueError(f"a step of {len(tokens)} tokens exceeds n_batch ({ctx.n_batch})")
        rc = ctx.decode(Batch(tokens=tokens, pos=pos, seq_ids=seq_ids, logits=flags))
        if rc != 0:
            raise DecodeError(rc, "batch")
        logits = ctx.get_logits() if any(flags) else None
        rows: list[np.ndarray | None] = []
        first = 0   # the item's first output row
        for seq_id, toks, n_out in items:
            n_out = int(n_out)
            if n_out:
                self._keep_hidden(seq_id, len(self.cached[seq_id]) + len(toks) - n_out, first, n_out)
            self.cached[seq_id] += toks
            rows.append(None if n_out == 0 else logits[first] if n_out == 1 else logits[first:first + n_out])
            first += n_out
        return rows

    def _keep_hidden(self, seq_id: int, pos: int, first: int = 0, n: int | None = None) -> None:
        """Keep the last decode's output rows [first, first + n) of hidden states (all by
        default) as those of seq_id from position pos on, where the context computes them."""
        if self.ctx.embeddings_nextn:
            rows = self.ctx.get_embeddings_nextn()
            self._hidden[seq_id] = (pos, np.array(rows[first:first + n if n is not None else len(rows)]))

    def hidden_state(self, seq_id: int, pos: int) -> np.ndarray | None:
        """The final normed hidden state of seq_id's token at `pos` from its last decode
        (what a multi-token-prediction drafter continues from), or None where it was not
        an output of that decode or the context keeps none."""
        kept = self._hidden.get(seq_id)
        if kept is None or not kept[0] <= pos < kept[0] + len(kept[1]):
            return None
        return kept[1][pos - kept[0]]

    def decode_draft(self, seq_id: int, tokens: list[int]) -> np.ndarray:
        """Decode the pending token and a speculative draft after it for `seq_id`, with the
        logits of every one ([len(tokens), n_vocab]); `settle_draft` then drops what the
        check rejected."""
        self.start_draft(seq_id)
        return self.decode_mixed([(seq_id, tokens, len(tokens))])[0]

    def start_draft(self, seq_id: int) -> None:
        """Before a decode that carries a speculative draft for `seq_id`: where the memory
        cannot drop tokens (recurrent states), keep the sequence's state to go back to
        (llama-server's checkpoint before a draft)."""
        state = self.ctx.memory.seq_state(seq_id) if self.ctx.recurrent else None
        self._drafts[seq_id] = (len(self.cached[seq_id]), state)

    def settle_draft(self, seq_id: int, tokens: list[int], n_kept: int) -> None:
        """After the check of `tokens` ([pending, *draft], decoded by the last decode): keep
        the pending token and the first n_kept draft tokens, drop the rest. A recurrent
        state goes back to before the draft and decodes the kept tokens again."""
        start, state = self._drafts.pop(seq_id)
        keep = start + 1 + n_kept
        if keep >= start + len(tokens):
            return
        if state is None:
            self.forget(seq_id, keep)
            return
        self.ctx.memory.restore_seq_state(seq_id, state)
        self.cached[seq_id] = self.cached[seq_id][:start]
        again = tokens[:1 + n_kept]
        rc = self.ctx.decode(Batch(tokens=again, pos=list(range(start, keep)), seq_ids=[[seq_id]] * len(again),
                                   logits=[False] * len(again)))
        if rc != 0:
            raise DecodeError(rc, "replay of the accepted draft")
        self.cached[seq_id] += again

    def warmup(self) -> None:
        """One decode of one token, then an empty cache (llama.cpp's warm-up run): the
        backends prepare what they derive from the weights (the CPU backend repacks them)
        before the first request instead of during it."""
        vocab = self.ctx.model.vocab
        token = vocab.special.bos if vocab.special.bos is not None else 0
        rc = self.ctx.decode(Batch.from_tokens([token]))
        self.reset()
        if rc != 0:
            raise DecodeError(rc, "warm-up run")

    def n_past(self, seq_id: int) -> int:
        return len(self.cached[seq_id])

    def shift_context(self, seq_id: int, n_keep: int, n_discard: int) -> bool:
        """llama-server's context shift: drop positions [n_keep, n_keep + n_discard) of
        `seq_id` and move the later ones down by n_discard (their keys are re-rotated before
        the next decode). False, and nothing changed, where the cache cannot shift (an iSWA
        cache of two sizes, as llama.cpp's get_can_shift) or where a moved cell is shared
        with another sequence (a common prompt prefix: moving it would move it for both)."""
        mem = self.ctx.memory
        n_past = len(self.cached[seq_id])
        if n_discard <= 0 or n_keep + n_discard > n_past or not mem.can_shift:
            return False
        if mem.seq_shared(seq_id, n_keep + n_discard, n_past):
            return False
        mem.seq_rm(seq_id, n_keep, n_keep + n_discard)
        mem.seq_add(seq_id, n_keep + n_discard, n_past, -n_discard)
        cached = self.cached[seq_id]
        self.cached[seq_id] = cached[:n_keep] + cached[n_keep + n_discard:]
        return True

    def reuse_chunks(self, seq_id: int, prompt: list[int], n_past: int, min_chunk: int) -> int:
        """llama-server's cache reuse (`n_cache_reuse`): past the common prefix (n_past
        tokens), runs of at least `min_chunk` cached tokens that the prompt has further on
        are moved to their new positions (seq_rm of what lies between, seq_add of the run;
        keys re-rotated before the next decode) instead of being decoded again. Returns the
        new n_past; the caller drops the cells after it (`forget`). Nothing moves where the
        cache cannot shift, nor a run whose cells another sequence shares (a common
        prefix), and the prompt's last token is always left to decode, for its logits."""
        mem = self.ctx.memory
        if min_chunk <= 0 or not mem.can_shift:
            return n_past
        cached = self.cached[seq_id]
        head_c = head_p = n_past
        end_p = len(prompt) - 1
        while head_c < len(cached) and head_p < end_p:
            n = 0
            while (head_c + n < len(cached) and head_p + n < end_p
                   and cached[head_c + n] == prompt[head_p + n]):
                n += 1
            if n >= min_chunk and not mem.seq_shared(seq_id, head_c, head_c + n):
                mem.seq_rm(seq_id, head_p, head_c)
                mem.seq_add(seq_id, head_c, head_c + n, head_p - head_c)
                cached[head_p:head_p + n] = prompt[head_p:head_p + n]
                head_c += n
                head_p += n
            else:
                head_c += 1
        return head_p

    def forget(self, seq_id: int, keep: int = 0) -> int:
        """Drop the cells of `seq_id` from position `keep` on; returns how many tokens stay.
        A recurrent state cannot lose its last tokens (seq_rm refuses): there the sequence
        goes back to the newest context checkpoint within its first `keep` tokens, or, with
        none, starts over (as llama-server)."""
        mem = self.ctx.memory
        if not mem.seq_rm(seq_id, keep, -1):
            ckpt = self.checkpoints.newest_within(seq_id, keep)
            if ckpt is None:
                mem.seq_rm(seq_id, -1, -1)
                keep = 0
            else:
                mem.restore_seq_state(seq_id, ckpt.state)
                keep = ckpt.n_tokens
        self.checkpoints.drop_after(seq_id, keep)
        self.cached[seq_id] = self.cached[seq_id][:keep]
        return keep

    def reset(self) -> None:
        self.ctx.memory.clear()
        self.cached = [[] for _ in range(self.ctx.n_seq_max)]
        self.checkpoints = Checkpoints(self.ctx.n_seq_max, self.checkpoints.n_max)
