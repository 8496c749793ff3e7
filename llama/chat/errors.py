"""The one error a chat template can raise.

Chat templates come from model files, so they are untrusted input: a template that does not
parse, calls `raise_exception`, or reaches for something the sandbox refuses is a problem
with the file (or with the messages it was given), not a bug in the caller. One error type,
a `ValueError` as llama-cpp-python's callers expect, lets the API and the server turn all of
them into a clean 4xx/exception instead of a traceback from inside jinja2.
"""
from __future__ import annotations


class ChatTemplateError(ValueError):
    """A chat template failed to parse or to render; the message names the template."""

    def __init__(self, template_name: str, reason: str) -> None:
        super().__init__(f"{template_name}: {reason}")
        self.template_name = template_name
        self.reason = reason
