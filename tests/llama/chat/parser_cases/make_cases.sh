#!/bin/sh
# Regenerate test_chat.jsonl: llama.cpp's own chat-parser cases (tests/test-chat.cpp), one JSON
# line each, written by llama.cpp's test binary itself (dump_cases.patch adds the writer).
#
#   sh tests/llama/chat/parser_cases/make_cases.sh /path/to/llama.cpp
#
# The llama.cpp source is the one llama-cpp-python 0.3.36 vendors (`vendor/llama.cpp` of its
# sdist); the patch is applied to a copy of the test file, so the source tree is left as it was.
set -eu
LLAMA_CPP=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

mkdir "$WORK/llama.cpp"
(cd "$LLAMA_CPP" && tar --exclude=./build -cf - .) | (cd "$WORK/llama.cpp" && tar -xf -)
cd "$WORK/llama.cpp"
patch -p1 < "$HERE/dump_cases.patch"
cmake -B build -G Ninja -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release > /dev/null
ninja -C build test-chat > /dev/null
CHAT_CASES_DUMP="$WORK/cases.jsonl" ./build/bin/test-chat > /dev/null 2>&1
# the template paths relative to models/templates/, as tests/llama/chat/templates/ names them
python3 - "$WORK/cases.jsonl" "$HERE/test_chat.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], encoding="utf-8") as src, open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in src:
        case = json.loads(line)
        case["template"] = case["template"].rsplit("/", 1)[-1]
        out.write(json.dumps(case, ensure_ascii=False) + "\n")
EOF
echo "wrote $(wc -l < "$HERE/test_chat.jsonl") cases to $HERE/test_chat.jsonl"
