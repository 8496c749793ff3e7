"""Generate tests/llama/chat/expected/_llama_cpp_python_formats.json: the prompts (and stop strings)
llama-cpp-python 0.3.36's own named chat formats (`llama_cpp.llama_chat_format`, the
functions its `chat_format=` names select) make of the conversations below.

    LLAMA_CPP_LIB_PATH=.../vendor/llama.cpp/build/bin PYTHONPATH=<its sdist> \\
        python tests/llama/chat/make_named_formats_expected.py

(Any Python where `import llama_cpp` works; the formatters themselves are pure Python.)
"""
from __future__ import annotations

import json
from pathlib import Path

from llama_cpp import llama_chat_format as f

HERE = Path(__file__).resolve().parent

# name -> the formatter function registered under it (vicuna's is called `format`)
FORMATTERS = {
    "llama-2": f.format_llama2, "llama-3": f.format_llama3, "alpaca": f.format_alpaca,
    "qwen": f.format_qwen, "vicuna": f.format, "oasst_llama": f.format_oasst_llama,
    "baichuan-2": f.format_baichuan2, "baichuan": f.format_baichuan, "openbuddy": f.format_openbuddy,
    "redpajama-incite": f.format_redpajama_incite, "snoozy": f.format_snoozy, "phind": f.format_phind,
    "intel": f.format_intel, "open-orca": f.format_open_orca, "mistrallite": f.format_mistrallite,
    "zephyr": f.format_zephyr, "pygmalion": f.format_pygmalion, "chatml": f.format_chatml,
    "mistral-instruct": f.format_mistral_instruct, "chatglm3": f.format_chatglm3,
    "openchat": f.format_openchat, "saiga": f.format_saiga, "gemma": f.format_gemma,
}

CONVERSATIONS = {
    "one_user": [{"role": "user", "content": "Hello"}],
    "system_and_user": [{"role": "system", "content": "You are terse."},
                        {"role": "user", "content": "Name a colour."}],
    "multi_turn": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "no_system_two_turns": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                            {"role": "user", "content": "And 3+3?"}],
    "empty_system": [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}],
    "two_systems": [{"role": "system", "content": "First."}, {"role": "user", "content": "Q"},
                    {"role": "system", "content": "Second."}, {"role": "user", "content": "R"}],
    "unicode": [{"role": "user", "content": "Привіт, 你好 🌟"}],
}


def main() -> None:
    records = []
    for name, formatter in FORMATTERS.items():
        for case, messages in CONVERSATIONS.items():
            result = formatter(messages=[dict(m) for m in messages])
            stop = result.stop
            stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
            records.append({"format": name, "case": case, "messages": messages,
                            "prompt": result.prompt, "stop": stops})
    out = HERE / "expected" / "_llama_cpp_python_formats.json"
    out.write_text(json.dumps({"source": "llama-cpp-python 0.3.36, llama_cpp/llama_chat_format.py",
                               "records": records}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(records)} records -> {out}")


if __name__ == "__main__":
    main()
