"""The server's scheduler with a drafter that fails: the slot goes on without a draft, and
its request ends as it would without speculative decoding."""
import queue

from ggmlpy.testing.models_archs import write_tiny_model
from llama import Llama
from llama.api.completion import make_sequence
from llama.api.sequence import SamplingParams
from llama.server.scheduler import Scheduler, Task
from llama.speculative import Drafter


class Failing(Drafter):
    def __init__(self):
        self.calls = 0

    def draft(self, seq_id, history, n_max):
        self.calls += 1
        raise RuntimeError("the draft model's decode failed")


def _run(llm: Llama, prompt: list[int], drafter: Drafter | None) -> tuple[list[int], list[str]]:
    seq = make_sequence(llm, prompt, max_tokens=8, stop=None, logprobs=None, params=SamplingParams(temperature=0.0))
    events: queue.Queue = queue.Queue()
    sched = Scheduler(llm.engine, 1, drafter=drafter)
    sched.start()
    try:
        sched.submit(Task(seq, sink=lambda kind, payload: events.put(kind)))
        kinds = []
        while not kinds or kinds[-1] not in ("done", "error"):
            kinds.append(events.get(timeout=60))
    finally:
        sched.stop()
    llm.engine.reset()
    return seq.tokens, kinds


def test_a_failing_drafter_costs_the_draft_not_the_request(tmp_path):
    llm = Llama(str(write_tiny_model("llama", tmp_path / "t.gguf", n_layer=2)), n_ctx=256, verbose=False)
    prompt = llm.tokenize(b"hello world")
    want, _ = _run(llm, prompt, None)
    failing = Failing()
    got, kinds = _run(llm, prompt, failing)
    assert got == want and len(want) == 8 and kinds[-1] == "done" and "error" not in kinds
    assert failing.calls == 6   # before each of the 7 decodes but the last (one token left, no room)
