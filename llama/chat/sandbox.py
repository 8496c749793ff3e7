"""The jinja2 environment chat templates run in: jinja2's immutable sandbox (made to refuse
unsafe attributes loudly, see StrictSandbox) plus exactly the extras Hugging Face's
`render_jinja_template` gives templates, so a template written for transformers renders
the same bytes here.

Mirrors `transformers.utils.chat_template_utils._cached_compile_jinja_template`:
`raise_exception`, `strftime_now`, a `tojson` filter without HTML escaping, a `dict` that
only builds dicts, a `namespace` that refuses underscore names, and the `{% generation %}`
block tag (HF uses it to find assistant tokens; here it just renders its body, because a
template that uses it must still parse).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

Clock = Callable[[], datetime]
MIN_JINJA2 = (3, 1, 6)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


class TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without exposing the `dict` type
    itself (whose attributes would be a way out of the sandbox)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """jinja2's `namespace` that refuses underscore-prefixed attribute names, as HF's does,
    so a template cannot plant dunder attributes on it."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as jinja2's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"templates cannot store underscore-prefixed attributes on a namespace: {name!r}")


class ConcatUndefined(jinja2.Undefined):
    """The lenient environment's undefined: joined to a string it reads as "", as llama.cpp's
    template engine reads it (FireFunction v2's template adds `functions`, which nothing
    defines); any other use raises."""

    def __add__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self._fail_with_undefined_error()

    def __radd__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self._fail_with_undefined_error()


class StrictSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, refusing loudly.

    jinja2 answers an unsafe attribute (`x.__class__`, `"{0.__mro__}".format(x)`) with an
    undefined value that prints as "" and raises only when used further; transformers
    inherits that. Here the access itself raises SecurityError, so a template that reaches
    for interpreter internals fails with ChatTemplateError instead of rendering a silently
    different prompt. No legitimate template reads such attributes (the 70 real templates
    in tests/llama/chat render identically either way).
    """

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def raise_exception(message: str) -> None:
    """What templates call to reject their input (e.g. roles not alternating)."""
    raise TemplateError(message)


def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """HF's `tojson`: plain `json.dumps` (jinja2's own escapes `<>&'` for HTML)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def lenient_tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """`tojson` as llama.cpp's engine has it: the result of a filter such as `map` (a
    generator here) is written as the list it stands for."""
    def listed(value: Any) -> Any:
        if isinstance(value, Iterator):
            return list(value)
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=listed)


def make_environment(clock: Clock = datetime.now, lenient: bool = False) -> StrictSandbox:
    """A fresh environment; `clock` is what `strftime_now` reads (injectable so that tests
    and reproducible prompts need no patched global time). `lenient`: an undefined variable
    joined to a string is "" (llama.cpp's engine) rather than an error (transformers')."""

    def strftime_now(format: str) -> str:
        return clock().strftime(format)

    if _version_tuple(jinja2.__version__) < MIN_JINJA2:
        raise RuntimeError(f"chat templates need jinja2>={'.'.join(map(str, MIN_JINJA2))} (older sandboxes have "
                           f"known escapes, CVE-2024-56326 and CVE-2025-27516); found {jinja2.__version__}")
    env = StrictSandbox(undefined=ConcatUndefined if lenient else jinja2.Undefined,
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = lenient_tojson if lenient else tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
