"""llama.cpp's speculative options as one drafter (llama/speculative/kinds.py), shared by
`ggmlpy serve` and `ggmlpy chat`: which kinds a set of flags turns on, what each binds to,
and `ggmlpy chat` with them (a real subprocess) replying as it does without a draft."""
import subprocess
import sys

import pytest

from ggmlpy.testing.models_archs import write_tiny_model
from ggmlpy.testing.models_gemma4 import write_tiny_gemma4_assistant
from llama import Llama
from llama.speculative import FirstOf, NgramSimple
from llama.speculative.draft_model import DraftModel
from llama.speculative.kinds import SpecDraft
from llama.speculative.mtp import MtpDrafter


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kinds")
    gemma4 = write_tiny_model("gemma4", folder / "gemma4.gguf")
    return {"llama": write_tiny_model("llama", folder / "llama.gguf"), "gemma4": gemma4,
            "assistant": write_tiny_gemma4_assistant(folder / "assistant.gguf", gemma4)}


def test_no_kind_no_drafter(files):
    assert SpecDraft.from_options([]) is None
    assert SpecDraft.from_options(["none", "ngram-simple"], str(files["llama"])) is None


def test_each_kind_binds_to_its_drafter(files):
    target = Llama(str(files["llama"]), n_ctx=128, verbose=False).engine
    ngram = SpecDraft.from_options(["ngram-simple"], ngram_size_n=3, ngram_size_m=7).bind(target)
    assert isinstance(ngram, NgramSimple) and (ngram.size_n, ngram.size_m) == (3, 7)
    plain = SpecDraft.from_options([], str(files["llama"]), n_max=5)   # -md alone: draft-simple
    assert plain.types == ("draft-simple",)
    drafter = plain.bind(target)
    assert isinstance(drafter, DraftModel) and drafter.limits.n_max == 5
    both = SpecDraft.from_options(["draft-simple", "ngram-simple"], str(files["llama"])).bind(target)
    assert isinstance(both, FirstOf) and [type(d) for d in both.drafters] == [NgramSimple, DraftModel]
    gemma = Llama(str(files["gemma4"]), n_ctx=128, verbose=False).engine
    mtp = SpecDraft.from_options([], str(files["assistant"]))           # a gemma4-assistant: draft-mtp
    assert mtp.types == ("draft-mtp",) and isinstance(mtp.bind(gemma), MtpDrafter)


@pytest.mark.parametrize("names, message", [
    (["ngram-mod"], "ggmlpy implements none, ngram-simple"), (["draft-simple"], "needs a draft model"),
    (["eagle"], "unknown speculative type: eagle")])
def test_refused_kinds_are_named(names, message):
    with pytest.raises(ValueError, match=message):
        SpecDraft.from_options(names)


def _chat(model, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ggmlpy", "chat", "-m", str(model), "--temp", "0", "-n", "24",
                           "-c", "512", *flags], input="Say hello hello hello hello\nAgain\n/exit\n",
                          capture_output=True, text=True, timeout=300)


def test_chat_with_a_draft_replies_the_same(files):
    plain = _chat(files["llama"], "--chat-format", "chatml")
    assert plain.returncode == 0, plain.stderr
    for flags in (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "8"],
                  ["-md", str(files["llama"]), "--spec-draft-n-max", "4"]):
        drafted = _chat(files["llama"], "--chat-format", "chatml", *flags)
        assert drafted.returncode == 0, drafted.stderr
        assert drafted.stdout == plain.stdout, flags
    bad = _chat(files["llama"], "--spec-type", "ngram-mod")
    assert bad.returncode != 0 and "--spec-type ngram-mod" in bad.stderr
