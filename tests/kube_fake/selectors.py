"""Label and field selectors with the apiserver's grammar and error texts.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``,
``k``, ``!k``, ``k>N``, ``k<N``; a comma means AND.
Field selectors: ``field=v``, ``field==v``, ``field!=v`` with ``\\,``, ``\\=``
and ``\\\\`` escapes.  Which fields a resource accepts is decided by the
caller (see ``ResourceType.field_labels``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_NAME_RE = re.compile(rf"^{_NAME}$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SET_RE = re.compile(r"^(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)$")
_CMP_RE = re.compile(r"^(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|!=|=|<|>)\s*(?P<val>[^\s!=<>(),]*)$")
_EXISTS_RE = re.compile(r"^(?P<neg>!?)\s*(?P<key>[^\s!=<>(),]+)$")


class SelectorError(ValueError):
    """The selector string is malformed; the server answers 400 BadRequest."""


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key, "")
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        # ">" / "<": integer comparison; a non-integer label simply does not match.
        try:
            have, want = int(value), int(self.values[0])
        except ValueError:
            return False
        return has and (have > want if self.op == ">" else have < want)


def _check_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        raise SelectorError(
            f'unable to parse requirement: invalid label key "{key}": prefix part must be a DNS subdomain'
        )
    if not name or len(name) > 63 or not _NAME_RE.match(name):
        raise SelectorError(
            f'unable to parse requirement: invalid label key "{key}": name part must consist of alphanumeric '
            "characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )


def _check_value(value: str) -> None:
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise SelectorError(
            f'unable to parse requirement: invalid label value: "{value}": '
            "a valid label must be an empty string "
            "or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )


def _split_top_level(text: str) -> list[str]:
    terms: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur))
    return terms


def parse_label_selector(text: str | None) -> list[LabelRequirement]:
    if text is None or not text.strip():
        return []
    reqs: list[LabelRequirement] = []
    for raw in _split_top_level(text):
        term = raw.strip()
        if m := _SET_RE.match(term):
            values = tuple(v.strip() for v in m["vals"].split(",") if v.strip())
            if not values:
                raise SelectorError(
                    f"unable to parse requirement: for '{m['op']}' operator, values set can't be empty"
                )
            for v in values:
                _check_value(v)
            req = LabelRequirement(m["key"], m["op"], values)
        elif m := _CMP_RE.match(term):
            op = "=" if m["op"] == "==" else m["op"]
            if op in ("<", ">") and not re.fullmatch(r"-?\d+", m["val"]):
                raise SelectorError(
                    "unable to parse requirement: for 'Gt', 'Lt' operators, "
                    f"the value must be an integer: {term}"
                )
            if op in ("=", "!="):
                _check_value(m["val"])
            req = LabelRequirement(m["key"], op, (m["val"],))
        elif m := _EXISTS_RE.match(term):
            req = LabelRequirement(m["key"], "!" if m["neg"] else "exists")
        else:
            raise SelectorError(f"unable to parse requirement: found '{term}', expected: identifier")
        _check_key(req.key)
        reqs.append(req)
    return reqs


def labels_match(reqs: list[LabelRequirement], obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in reqs)


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.field) == self.value) != self.negate


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_field_selector(text: str | None) -> list[FieldRequirement]:
    if text is None or not text.strip():
        return []
    reqs: list[FieldRequirement] = []
    for term in _split_unescaped(text, ","):
        m = re.match(r"^(?P<f>[^=!\\]+?)\s*(?P<op>!=|==|=)(?P<v>.*)$", term.strip())
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        reqs.append(FieldRequirement(m["f"].strip(), m["op"] == "!=", _unescape(m["v"])))
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
