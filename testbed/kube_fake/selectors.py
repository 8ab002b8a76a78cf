"""Label and field selectors of list and watch requests, with the apiserver's semantics and error texts.

Label selectors are parsed and matched by ``bridge.labels`` (a port of
k8s.io/apimachinery/pkg/labels, error texts included; the webhook and the node
rules use the same): ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``,
``k``, ``!k``, ``k>N``, ``k<N``; ``k in ()`` selects the objects whose label ``k``
is ``""``. Here they only meet an object's ``metadata.labels``.
Field selectors are the API server's alone, parsed as k8s.io/apimachinery/pkg/fields
does: ``field=v``, ``field==v``, ``field!=v``, ``\\,`` ``\\=`` and ``\\\\`` escapes, an
unescaped ``=`` or ``,`` in a value is an error. Which fields a resource accepts is
decided by the caller (see ``ResourceType.field_labels``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bridge.labels import LabelSelectorError, Selector, parse_selector


class SelectorError(ValueError):
    """The selector string is malformed; the server answers 400 BadRequest."""


def parse_label_selector(text: str | None) -> Selector:
    """labels.Parse, as bridge.labels ports it; absent matches everything."""
    try:
        return parse_selector(text or "")
    except LabelSelectorError as exc:
        raise SelectorError(str(exc)) from exc


def labels_match(selector: Selector, obj: Mapping[str, Any]) -> bool:
    return selector.matches((obj.get("metadata") or {}).get("labels"))


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.field) == self.value) != self.negate


def _split_terms(text: str) -> list[str]:
    """fields.splitTerms: split on commas not escaped by a backslash."""
    terms: list[str] = []
    start, in_slash = 0, False
    for i, ch in enumerate(text):
        if in_slash:
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _unescape(value: str) -> str:
    """fields.UnescapeValue: only \\\\, \\, and \\= are escapes; a bare , or = is an error."""
    out: list[str] = []
    in_slash = False
    for ch in value:
        if in_slash:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch in ",=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if in_slash:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str | None) -> list[FieldRequirement]:
    """fields.ParseSelector: terms are handled in sorted order (so is the first error)."""
    if not text:
        return []
    reqs: list[FieldRequirement] = []
    for term in sorted(_split_terms(text)):
        if not term:
            continue
        # The first operator found scanning left to right, "!=" and "==" before "=".
        m = re.search(r"!=|==|=", term)
        if m is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        reqs.append(FieldRequirement(term[: m.start()], m.group() == "!=", _unescape(term[m.end() :])))
    return reqs


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form the apiserver compares against: missing -> "", bools lower-case."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def fields_match(reqs: list[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    return all(r.matches(obj) for r in reqs)
