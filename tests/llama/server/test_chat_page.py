"""The chat page at `/` in a real browser: Debian's chromium driven by playwright against real
`ggmlpy serve` servers on SmolLM2. What the page shows is compared with what an independent
client (httpx) gets for the same request: the streamed answer, the folded reasoning of a
thinking template, a forced tool call. Conversations survive a reload, the Stop button ends
a stream, a wrong API key is shown as such, and no request leaves loopback."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.browser import chromium, needs_browser
from tests.llama.server.conftest import running

pytestmark = needs_browser

KEY = "page-key-42"
R1_TEMPLATE = Path(__file__).parents[1] / "chat" / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}}]
# Chromium logs every non-2xx fetch as a console error: expected only where a 401 is the point
REFUSED = "Failed to load resource: the server responded with a status of 401"


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running(smollm2_path, parallel=2, ctx_size=1024, api_keys=[KEY]) as s:
        yield s


@pytest.fixture(scope="module")
def thinker(smollm2_path):
    """A thinking template (the prompt ends in `<think>`) with a budget of 6 reasoning tokens:
    the server forces `</think>` after them, so the answer has reasoning, then content."""
    with running(smollm2_path, ctx_size=1024, chat_template=R1_TEMPLATE.read_text(), reasoning_budget=6) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


class ChatPage:
    """The page of `server` in a fresh browser context (its own localStorage), recording
    console errors, every request's URL and the chat requests' bodies."""

    def __init__(self, browser, server):
        self.server = server
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.bodies: list[dict] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", self._record)
        self.open()

    def _record(self, request) -> None:
        self.requests.append(request.url)
        if request.url.endswith("/v1/chat/completions"):
            self.bodies.append(json.loads(request.post_data))

    def open(self) -> None:
        self.page.goto(self.server.url + "/")
        self.page.wait_for_selector("body[data-ready='1']", timeout=15000)

    def settings(self, **values) -> None:
        if self.page.is_hidden("#settings"):
            self.page.click("#settings-toggle")
        for name, value in values.items():
            if name == "tool_choice":
                self.page.select_option("#tool_choice", value)
            else:
                self.page.fill(f"#{name.replace('_', '-') if name == 'api_key' else name}", str(value))

    def send(self, text: str, timeout: float = 30000) -> dict:
        """Sends text; once the answer has ended, returns it as the page shows it."""
        n = self.page.locator(".msg.assistant").count() + 1
        self.page.fill("#input", text)
        self.page.click("#send")
        self.page.wait_for_function(
            "n => { const m = document.querySelectorAll('.msg.assistant');"
            " return m.length >= n && m[n - 1].dataset.state !== 'streaming'; }", arg=n, timeout=timeout)
        return self.answer(n - 1)

    def answer(self, i: int = -1) -> dict:
        return self.page.evaluate("""i => {
            const all = document.querySelectorAll('.msg.assistant'), m = all[i < 0 ? all.length + i : i];
            const details = m.querySelector('details.reasoning');
            return {state: m.dataset.state, content: m.querySelector('.content').textContent,
                    reasoning: details.hidden ? null : m.querySelector('.reasoning-text').textContent,
                    reasoning_open: details.open,
                    reasoning_first: !!(details.compareDocumentPosition(m.querySelector('.content'))
                                        & Node.DOCUMENT_POSITION_FOLLOWING),
                    calls: [...m.querySelectorAll('.tool-call')].map(c => ({
                        name: c.querySelector('.tool-name').textContent,
                        arguments: c.querySelector('.tool-args').textContent}))};
        }""", i)

    def messages(self) -> list[tuple[str, str]]:
        return [tuple(x) for x in self.page.eval_on_selector_all(
            "#messages .msg", "ms => ms.map(m => [m.classList[1], m.querySelector('.content').textContent])")]

    def check_clean(self, allowed_errors: tuple[str, ...] = ()) -> None:
        """Nothing but this server was asked, and the console stayed quiet."""
        assert self.requests and all(url.startswith(self.server.url + "/") for url in self.requests), self.requests
        assert [e for e in self.errors if not e.startswith(allowed_errors)] == []

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def chat(browser, server):
    page = ChatPage(browser, server)
    yield page
    page.close()


def api(server, body: dict, stream: bool) -> dict:
    """The same request from httpx: the answer's message, a stream assembled as a client would."""
    headers = {"Authorization": f"Bearer {KEY}"} if server.config.api_keys else {}
    if not stream:
        r = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": False}, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]
    out = {"content": "", "reasoning_content": ""}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers,
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    for field in out:
                        out[field] += choice["delta"].get(field) or ""
    return out


def test_a_streamed_answer_equals_the_api_answer_and_survives_a_reload(chat, server):
    chat.settings(api_key=KEY, temperature=0, max_tokens=12, seed=7, system="You are terse.")
    shown = chat.send("Name three colors.")
    body = chat.bodies[-1]
    assert body["stream"] is True and (body["temperature"], body["max_tokens"], body["seed"]) == (0, 12, 7)
    assert body["messages"] == [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "Name three colors."}]
    assert shown["state"] == "done" and shown["reasoning"] is None and shown["calls"] == []
    assert shown["content"] == api(server, body, stream=False)["content"] != ""
    # the second turn carries the first; the page keeps both across a reload
    second = chat.send("And two more?")
    assert chat.bodies[-1]["messages"][1:] == [{"role": "user", "content": "Name three colors."},
                                               {"role": "assistant", "content": shown["content"]},
                                               {"role": "user", "content": "And two more?"}]
    before = chat.messages()
    assert before == [("user", "Name three colors."), ("assistant", shown["content"]),
                      ("user", "And two more?"), ("assistant", second["content"])]
    chat.page.reload()
    chat.page.wait_for_selector("body[data-ready='1']")
    assert chat.messages() == before
    assert chat.page.input_value("#temperature") == "0" and chat.page.input_value("#api-key") == KEY
    chat.check_clean()


def test_conversations_are_listed_switched_and_deleted(chat):
    chat.settings(api_key=KEY, temperature=0, max_tokens=4)
    chat.send("First chat")
    chat.page.click("#new-conv")
    assert chat.messages() == []
    chat.send("Second chat")
    titles = chat.page.eval_on_selector_all(".conv .conv-title", "ts => ts.map(t => t.textContent)")
    assert titles == ["Second chat", "First chat"]
    chat.page.click(".conv:nth-child(2) .conv-title")
    assert chat.messages()[0] == ("user", "First chat")
    chat.page.click(".conv:nth-child(1) .conv-delete")   # deletes "Second chat"
    chat.page.reload()
    chat.page.wait_for_selector("body[data-ready='1']")
    assert chat.page.eval_on_selector_all(".conv .conv-title", "ts => ts.map(t => t.textContent)") == ["First chat"]
    assert chat.messages()[0] == ("user", "First chat")
    chat.check_clean()


def test_reasoning_is_shown_folded_above_the_answer(browser, thinker):
    chat = ChatPage(browser, thinker)
    try:
        chat.settings(temperature=0, max_tokens=16)
        shown = chat.send("What is 2+2?")
        expected = api(thinker, chat.bodies[-1], stream=True)
        assert expected["reasoning_content"] and expected["content"]   # the budget made both
        assert shown["reasoning"] == expected["reasoning_content"]
        assert shown["content"] == expected["content"]
        assert shown["reasoning_open"] is False and shown["reasoning_first"]
        chat.page.reload()
        chat.page.wait_for_selector("body[data-ready='1']")
        assert chat.answer()["reasoning"] == expected["reasoning_content"]
        chat.check_clean()
    finally:
        chat.close()


def test_a_forced_tool_call_is_shown(chat, server):
    chat.settings(api_key=KEY, temperature=0, max_tokens=60, tools=json.dumps(TOOLS), tool_choice="required")
    shown = chat.send("What is the weather in Paris?")
    body = chat.bodies[-1]
    assert body["tools"] == TOOLS and body["tool_choice"] == "required"
    assert [c["name"] for c in shown["calls"]] == ["get_weather"]
    arguments = json.loads(shown["calls"][0]["arguments"])
    jsonschema.validate(arguments, WEATHER)
    assert shown["calls"][0]["arguments"] == api(server, body, stream=False)["tool_calls"][0]["function"]["arguments"]
    chat.check_clean()


def test_a_wrong_key_is_refused_then_the_right_one_works(chat):
    chat.settings(api_key="not-the-key", temperature=0, max_tokens=4)
    chat.page.fill("#input", "Hello")
    chat.page.click("#send")
    chat.page.wait_for_selector("#error:not([hidden])")
    error = chat.page.text_content("#error")
    assert "invalid API key" in error and "401" in error
    assert chat.messages() == [] and chat.page.input_value("#input") == "Hello"   # back in the box
    chat.settings(api_key=KEY)
    chat.page.click("#send")
    chat.page.wait_for_function("() => document.querySelector('.msg.assistant[data-state=done]')")
    assert chat.page.is_hidden("#error") and chat.answer()["content"]
    chat.check_clean(allowed_errors=(REFUSED,))


def test_stop_ends_the_stream(chat):
    chat.settings(api_key=KEY, max_tokens=400)
    chat.page.fill("#input", "Tell me a long story about a dragon.")
    chat.page.click("#send")
    chat.page.wait_for_function("() => document.querySelector('.msg.assistant .content').textContent.length > 0")
    chat.page.click("#stop")
    chat.page.wait_for_selector(".msg.assistant[data-state=stopped]")
    assert chat.page.is_hidden("#error") and chat.page.is_enabled("#send") and chat.page.is_disabled("#stop")
    assert chat.answer()["content"]
    chat.check_clean()


def sse(*events: dict | str) -> str:
    return "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\r\n\r\n" for e in events)


def delta(**fields) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_fragments_are_joined_and_markup_stays_text(chat):
    """A stream written here (the page's request answered by playwright): fragments of
    reasoning, content and two interleaved tool calls are joined, a ping is skipped, the
    model's markup is shown as text, and an error event after some text keeps that text."""
    markup = '<img src="x" onerror="window.pwned = 1"><b>bold</b>'
    body = ": ping\n\n" + sse(
        delta(role="assistant", content=None), delta(reasoning_content="Let me "), delta(reasoning_content="think."),
        delta(content=markup[:9]), delta(content=markup[9:]),
        delta(tool_calls=[{"index": 0, "id": "a", "function": {"name": "get_weather", "arguments": '{"ci'}}]),
        delta(tool_calls=[{"index": 1, "id": "b", "function": {"name": "get_time", "arguments": "{}"}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]), "[DONE]")
    chat.page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=body))
    shown = chat.send("Go")
    assert shown["reasoning"] == "Let me think." and shown["content"] == markup
    assert shown["calls"] == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                              {"name": "get_time", "arguments": "{}"}]
    assert chat.page.locator("#messages img, #messages b").count() == 0
    assert chat.page.evaluate("window.pwned") is None
    failing = sse(delta(content="Half"), {"error": {"code": 500, "message": "the slot failed", "type": "server_error"}})
    chat.page.unroute("**/v1/chat/completions")
    chat.page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=failing))
    shown = chat.send("Again")
    assert shown["state"] == "error" and shown["content"] == "Half"
    assert "the slot failed" in chat.page.text_content("#error")
    chat.check_clean()
