"""Generate tests/llama/chat/expected/_builtin_llama_cpp.json: what llama.cpp's C++ renders for
its built-in formats (`llama_chat_apply_template`, i.e. `llm_chat_detect_template` +
`llm_chat_apply_template` in src/llama-chat.cpp), called through llama-cpp-python's
ctypes binding.

    /tmp/PEER/bin/python tests/llama/chat/make_builtin_expected.py

(Any Python where `import llama_cpp` works. The committed data was made with
llama-cpp-python 0.3.36's package sources and the libllama.so built from its vendored
llama.cpp, selected with LLAMA_CPP_LIB_PATH.)

Two kinds of record: for every built-in name, every conversation below with and without
the generation prompt; and for every real template in tests/llama/chat/templates/, what the
C++ renders when given the template's source (it detects a format from the source, or
returns -1 when it recognises none), which the test uses as the oracle for
`detect_format`.
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llama_cpp

HERE = Path(__file__).resolve().parent

# `dots1` has no name in llama.cpp; it is reached by detection from this marker.
DETECTION_ONLY = {"dots1": "<|endofuserprompt|>"}

# Strings that exercise each rule of llm_chat_detect_template, with the format that reading
# the C++ says each must give (the test checks both the name and the C++ output).
DETECTION_PROBES = {
    "{{ '<|im_start|>' }}": "chatml",
    "<|im_start|><|im_sep|>": "phi4",
    "<|im_start|><end_of_utterance>": "smolvlm",
    "mistral-something": "llama2",
    "[INST][SYSTEM_PROMPT]": "mistral-v7",
    "[INST] {{ ' [INST] ' + system_message }}": "mistral-v1",
    "[AVAILABLE_TOOLS]{{ \"[INST]\" }}": "mistral-v3-tekken",
    "[AVAILABLE_TOOLS][INST]": "mistral-v3",
    "[INST] <<SYS>> content.strip()": "llama2-sys-strip",
    "{{ bos_token + '[INST] ' }}<<SYS>>": "llama2-sys-bos",
    "[INST] <<SYS>>": "llama2-sys",
    "[INST]": "llama2",
    "<|assistant|><|end|>": "phi3",
    "[gMASK]<sop><|user|>": "chatglm4",
    "<|assistant|><|user|><|tool_declare|>": "exaone-moe",
    "<|assistant|><|user|></s>": "falcon3",
    "<|assistant|><|user|>": "glmedge",
    "<|{{ item['role'] }}|><|begin_of_image|>": "glmedge",
    "<|user|><|endoftext|>": "zephyr",
    "{{ bos_token + message['role'] }}": "monarch",
    "<start_of_turn>": "gemma",
    "{{ '\\n\\nAssistant: ' + eos_token }}": "orion",
    "GPT4 Correct User": "openchat",
    "USER: ASSISTANT: ": "vicuna",
    "SYSTEM: USER: ASSISTANT: ": "vicuna-orca",
    "### Instruction:<|EOT|>": "deepseek",
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>": "command-r",
    "<|start_header_id|><|end_header_id|>": "llama3",
    "[gMASK]sop": "chatglm3",
    "<用户>": "minicpm",
    "{{ 'Assistant: ' + message['content'] + eos_token }}": "deepseek2",
    "<｜Assistant｜><｜User｜><｜end▁of▁sentence｜>": "deepseek3",
    "[|system|][|assistant|][|endofturn|]": "exaone3",
    "[|system|][|assistant|][|endofturn|][|tool|]": "exaone4",
    "rwkv-world template": "rwkv-world",
    "<|start_of_role|>": "granite",
    "<|start_of_role|><tool_call>g4_default_system_message": "granite-4.0",
    "<|start_of_role|><tools>": "granite-4.1",
    "message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]": "gigachat",
    "<|role_start|>": "megrez",
    "' Ассистент:'": "yandex",
    "<role>ASSISTANT</role>'HUMAN'": "bailing",
    "<role>ASSISTANT</role>\"HUMAN\"<think>": "bailing-think",
    "<role>ASSISTANT</role><role>HUMAN</role><|role_end|>": "bailing2",
    "<|header_start|><|header_end|>": "llama4",
    "<|endofuserprompt|>": "dots1",
    "<|extra_0|><|extra_4|>": "hunyuan-moe",
    "<|start|><|channel|>": "gpt-oss",
    "<｜hy_Assistant｜><｜hy_begin▁of▁sentence｜>": "hunyuan-vl",
    "<｜hy_Assistant｜><｜hy_place▁holder▁no▁3｜>": "hunyuan-dense",
    "<|im_assistant|>assistant<|im_middle|>": "kimi-k2",
    "<seed:bos>": "seed_oss",
    "{{ 'Assistant: '  + message['content'] + '<|separator|>' }}": "grok-2",
    "[unused9]系统：[unused10]": "pangu-embedded",
    "<|begin|><|end|><|content|>": "solar-open",
    "{{ messages }}": None,
    "": None,
}

CONVERSATIONS = {
    "system_user": [("system", "You are helpful."), ("user", "Hello!")],
    "user_only": [("user", "What is 2+2?")],
    "multi_turn": [("system", "  Be brief.\n"), ("user", " Hi \n"), ("assistant", "\tHello there. \n"),
                   ("user", "Joke?  ")],
    "assistant_last": [("user", "Say hi."), ("assistant", " Hi! ")],
    "two_systems": [("system", "First. "), ("system", " Second."), ("user", "Go"), ("system", "Late system"),
                    ("assistant", "ok")],
    "special_text": [("system", "Відповідай українською <&\"'>"),
                     ("user", "\v\f\u00a0日本語 — a < b && \"c\" 🙂\u3000\n\r"),
                     ("assistant", "\u2003Так.\u00a0")],
    "other_roles": [("user", "Weather?"), ("assistant_tool_call", "[{\"name\": \"w\"}]"),
                    ("tool", "{\"t\": 21}"), ("function", "f()"), ("assistant", "21 degrees")],
    "empty": [],
}


def apply(template: str, messages: list[tuple[str, str]], add_ass: bool) -> str | None:
    chat = (llama_cpp.llama_chat_message * max(len(messages), 1))()
    for i, (role, content) in enumerate(messages):
        chat[i].role = role.encode()
        chat[i].content = content.encode()
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), add_ass, buf, size)
    if n < 0:
        return None
    assert n < size
    return buf.raw[:n].decode("utf-8")


def builtin_names() -> list[str]:
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    out = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(out, n)
    return [name.decode() for name in out]


def main() -> None:
    names = builtin_names()
    formats = {}
    for name in names + sorted(DETECTION_ONLY):
        template = DETECTION_ONLY.get(name, name)
        formats[name] = [{"conversation": conv, "add_generation_prompt": add_ass,
                          "expected": apply(template, CONVERSATIONS[conv], add_ass)}
                         for conv in CONVERSATIONS for add_ass in (True, False)]
    real = {}
    for path in sorted((HERE / "templates").glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        real[path.name] = {conv: apply(source, CONVERSATIONS[conv], True) for conv in ("multi_turn", "other_roles")}
    probes = {probe: {"llama_cpp_reading": fmt,
                      **{conv: apply(probe, CONVERSATIONS[conv], True) for conv in ("multi_turn", "other_roles")}}
              for probe, fmt in DETECTION_PROBES.items()}
    data = {"generator": f"llama-cpp-python {llama_cpp.__version__} llama_chat_apply_template",
            "llama_cpp_names": names, "conversations": CONVERSATIONS, "formats": formats, "real_templates": real,
            "detection_probes": probes}
    out = HERE / "expected" / "_builtin_llama_cpp.json"
    out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(formats)} formats, {len(real)} real templates -> {out}")


if __name__ == "__main__":
    main()
