"""Hostile templates are refused with ChatTemplateError and have no effect.

Each attack names a real sandbox-escape technique: dunder walks from a literal or a global
to `os` (`cycler.__init__.__globals__`, `self.__init__`, `lipsum.__globals__`), str.format
attribute access (CVE-2024-56326 and its `|attr('format')` variant, CVE-2025-27516), the
mutation of containers the immutable sandbox forbids, and planting dunders on a
namespace. Where an attack would write a file if it ran, the test checks that the file was
not written.
"""
from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from llama.chat import ChatTemplate, ChatTemplateError

USER = [{"role": "user", "content": "hi"}]

ATTACKS = {
    "str_class": "{{ ''.__class__ }}",
    "mro_subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "list_class_via_messages": "{{ messages.__class__.__base__.__subclasses__() }}",
    "self_init_globals": "{{ self.__init__.__globals__ }}",
    "template_reference_context": "{{ self._TemplateReference__context }}",
    "joiner_globals": "{{ joiner.__init__.__globals__ }}",
    "namespace_globals": "{{ namespace.__init__.__globals__ }}",
    "raise_exception_globals": "{{ raise_exception.__globals__ }}",
    "strftime_now_closure": "{{ strftime_now.__closure__ }}",
    "function_code": "{{ raise_exception.__code__.co_consts }}",
    "dict_type": "{{ dict.__class__.__mro__ }}",
    "attr_filter_dunder": "{{ messages | attr('__class__') }}",
    "getitem_dunder": "{{ messages[0]['__class__'] }}",
    "loop_internals": "{% for m in messages %}{{ loop.__class__ }}{% endfor %}",
    "undefined_dunder": "{{ not_a_variable.__class__ }}",
    "format_dunder": "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "format_globals": "{{ '{0.__init__.__globals__}'.format(cycler) }}",
    "format_via_attr_filter": "{{ ('{0.__class__}' | attr('format'))(messages) }}",
    "format_map": "{{ '{m.__class__}'.format_map({'m': messages}) }}",
    "list_append": "{% set xs = [] %}{{ xs.append(1) }}",
    "messages_pop": "{{ messages.pop() }}",
    "dict_update": "{{ messages[0].update({'role': 'system'}) }}",
    "namespace_dunder": "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "namespace_underscore_kwarg": "{% set ns = namespace(_private=1) %}",
}


@pytest.mark.parametrize("source", ATTACKS.values(), ids=ATTACKS.keys())
def test_attack_is_refused(source: str) -> None:
    template = ChatTemplate(source, name="evil.jinja")
    with pytest.raises(ChatTemplateError, match="^evil.jinja: refused by the sandbox"):
        template.render(USER)


def _file_writing_attacks(marker: Path) -> dict[str, str]:
    return {
        "cycler_os_system": f"{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}",
        "lipsum_os_popen": f"{{{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}}}",
        "self_module_open": "{{ self.__init__.__globals__['__builtins__']['open']"
                            f"('{marker}', 'w').write('x') }}}}",
        "format_then_call": f"{{{{ ('{{0.__init__.__globals__[os]}}'.format(cycler)).system('touch {marker}') }}}}",
    }


@pytest.mark.parametrize("kind", ["cycler_os_system", "lipsum_os_popen", "self_module_open", "format_then_call"])
def test_attack_that_would_write_a_file_does_not(kind: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(ChatTemplateError, match="refused by the sandbox"):
        ChatTemplate(_file_writing_attacks(marker)[kind]).render(USER)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["cycler_os_system", "lipsum_os_popen", "self_module_open"])
def test_those_attacks_are_real(kind: str, tmp_path: Path) -> None:
    """Outside the sandbox the same templates do write the file (so the test above means something)."""
    marker = tmp_path / "pwned"
    jinja2.Environment().from_string(_file_writing_attacks(marker)[kind]).render()
    assert marker.exists()


class _Evil:
    """A caller object whose method would write a file; templates must never reach it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self) -> str:
        self.path.write_text("pwned")
        return "called"


def test_python_objects_become_inert_placeholders(tmp_path: Path) -> None:
    """Like transformers' `_plain_template_data`: a non-JSON object in messages, tools or
    kwargs is replaced by the string "<TypeName>" before the template sees it."""
    evil = _Evil(tmp_path / "pwned")
    template = ChatTemplate("{{ messages[0].content }}|{{ tools[0] }}|{{ extra }}|{{ messages[0].meta.obj }}")
    out = template.render([{"role": "user", "content": evil, "meta": {"obj": evil}}], tools=[evil], extra=evil)
    assert out == "<_Evil>|<_Evil>|<_Evil>|<_Evil>"
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].content.write() }}").render([{"role": "user", "content": evil}])
    assert not evil.path.exists()


def test_errors_name_the_template() -> None:
    with pytest.raises(ChatTemplateError, match=r"^chat template: does not parse"):
        ChatTemplate("{% if %}")
    with pytest.raises(ChatTemplateError, match=r"^my.gguf: raised: no system role") as info:
        ChatTemplate("{{ raise_exception('no system role') }}", name="my.gguf").render(USER)
    assert isinstance(info.value, ValueError)
    assert info.value.template_name == "my.gguf"
