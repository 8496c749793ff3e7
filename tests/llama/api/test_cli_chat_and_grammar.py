"""`ggmlpy chat` (a real subprocess fed through its stdin) and `ggmlpy run`'s structured
output options, checked against the Llama API and jsonschema/re."""
import json
import re
import subprocess
import sys

import jsonschema

from tests.ggmlpy.cli.test_cli_run import call

QUESTION = "What is the capital of France?"


def test_chat_streams_the_same_reply_as_the_api(smol, smollm2_path):
    res = subprocess.run([sys.executable, "-m", "ggmlpy", "chat", "-m", str(smollm2_path), "--temp", "0",
                          "-n", "16", "-c", "1024"],
                         input=f"{QUESTION}\nAnd of Italy?\n/exit\nnever read\n", capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    history = [{"role": "user", "content": QUESTION}]
    first = smol.create_chat_completion(history, max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "And of Italy?"}]
    second = smol.create_chat_completion(history, max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    assert res.stdout == f"{first}\n{second}\n"


def test_run_with_a_json_schema(tmp_path, smollm2_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7},
                                               "word": {"type": "string", "pattern": "^[a-z]{1,5}$"}},
              "required": ["n", "word"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    for seed in ("1", "2"):
        rc, out, err = call("run", "-m", str(smollm2_path), "-p", "A number and a word:", "-n", "40",
                            "--seed", seed, "--json-schema", str(path), "--json")
        assert rc == 0, err
        jsonschema.validate(json.loads(json.loads(out)["text"]), schema)


def test_run_with_a_gbnf_file_and_bad_files(tmp_path, smollm2_path):
    path = tmp_path / "g.gbnf"
    path.write_text('root ::= ("yes" | "no") " because " [a-z ]{3,12} "."\n')
    rc, out, err = call("run", "-m", str(smollm2_path), "-p", "Is the sky blue?", "-n", "30", "--seed", "3",
                        "--grammar-file", str(path), "--json")
    assert rc == 0, err
    assert re.fullmatch(r"(yes|no) because [a-z ]{3,12}\.", json.loads(out)["text"])
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= undefined_rule\n")
    rc, out, err = call("run", "-m", str(smollm2_path), "-p", "x", "--grammar-file", str(bad))
    assert rc == 1 and str(bad) in err and "Traceback" not in err
