"""Label and field selectors with the apiserver's grammar, semantics and error texts.

Label selectors are parsed as k8s.io/apimachinery/pkg/labels parses them (a lexer,
then a recursive-descent parser; this is a port, error texts included):
``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``,
``k>N``, ``k<N``; a comma means AND. An empty set ``()`` and empty members
(``(a,)``) stand for the empty value, as upstream: ``k in ()`` selects the
objects whose label ``k`` is ``""``. Keys and values are validated like labels
(qualified names, label values), with the server's messages.
Field selectors are parsed as k8s.io/apimachinery/pkg/fields does: ``field=v``,
``field==v``, ``field!=v``, ``\\,`` ``\\=`` and ``\\\\`` escapes, an unescaped
``=`` or ``,`` in a value is an error. Which fields a resource accepts is
decided by the caller (see ``ResourceType.field_labels``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# k8s.io/apimachinery/pkg/util/validation.
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_RE = re.compile(_QUALIFIED_NAME_FMT)
_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_LABEL_VALUE_FMT = f"({_QUALIFIED_NAME_FMT})?"
_LABEL_VALUE_RE = re.compile(_LABEL_VALUE_FMT)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS1123_SUBDOMAIN_RE = re.compile(_DNS1123_SUBDOMAIN_FMT)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_INT64 = re.compile(r"[+-]?[0-9]+")


class SelectorError(ValueError):
    """The selector string is malformed; the server answers 400 BadRequest."""


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.RegexError, double spaces and all."""
    text = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{fmt}')"


def _invalid(path: str, value: str, detail: str) -> str:
    """field.Invalid(...).Error() for a string value (Go's %q quoting)."""
    return f"{path}: Invalid value: {json.dumps(value, ensure_ascii=False)}: {detail}"


def _qualified_name_errors(value: str) -> list[str]:
    """validation.IsQualifiedName."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 characters")
            if not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
                errs.append(
                    "prefix part "
                    + _regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com")
                )
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errs.append(
            "name part "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def _label_value_errors(value: str) -> list[str]:
    """validation.IsValidLabelValue."""
    errs: list[str] = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE_RE.fullmatch(value):
        errs.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


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
        if not has or not _INT64.fullmatch(value):
            return False
        have, want = int(value), int(self.values[0])
        return have > want if self.op == ">" else have < want


# ------------------------------------------------------------------ the lexer
_WHITESPACE = " \t\r\n"
_SPECIAL = "=!(),><"
# string2token: the special symbols and the two keywords.
_SYMBOLS = {"(": "(", ")": ")", ",": ",", "!": "!", "!=": "!=", "=": "=", "==": "==", ">": ">", "<": "<"}
_KEYWORDS = {"in": "in", "notin": "notin"}
_ID = "identifier"
_END = "end"


def _lex(text: str) -> list[tuple[str, str]]:
    """(token, literal) pairs, ending with (end, "")."""
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append((_END, ""))
            return tokens
        if text[i] in _SPECIAL:
            # The longest symbol that is a token (every single special character is one).
            j, last = i, ("", "")
            while j < n and text[j] in _SPECIAL:
                buffer = text[i : j + 1]
                if buffer in _SYMBOLS:
                    last = (_SYMBOLS[buffer], buffer)
                elif last[0]:
                    break
                j += 1
            tokens.append(last)
            i += len(last[1])
            continue
        j = i
        while j < n and text[j] not in _WHITESPACE and text[j] not in _SPECIAL:
            j += 1
        word = text[i:j]
        tokens.append((_KEYWORDS.get(word, _ID), word))
        i = j


class _LabelParser:
    """labels.Parser: lookahead/consume over the scanned tokens."""

    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def lookahead(self, values: bool) -> tuple[str, str]:
        tok, lit = self.items[self.position]
        if values and tok in ("in", "notin"):
            tok = _ID  # in the values context the keywords are identifiers
        return tok, lit

    def consume(self, values: bool) -> tuple[str, str]:
        found = self.lookahead(values)
        self.position += 1
        return found

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        while True:
            tok, lit = self.lookahead(True)
            if tok in (_ID, "!"):
                try:
                    requirements.append(self.requirement())
                except SelectorError as exc:
                    raise SelectorError(f"unable to parse requirement: {exc}") from exc
                tok, lit = self.consume(True)
                if tok == _END:
                    return requirements
                if tok != ",":
                    raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
                tok, lit = self.lookahead(True)
                if tok not in (_ID, "!"):
                    raise SelectorError(f"found '{lit}', expected: identifier after ','")
            elif tok == _END:
                return requirements
            else:
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> LabelRequirement:
        op = ""
        tok, key = self.consume(True)
        if tok == "!":
            op = "!"
            tok, key = self.consume(True)
        if tok != _ID:
            raise SelectorError(f"found '{key}', expected: identifier")
        if errs := _qualified_name_errors(key):
            raise SelectorError(_invalid("<nil>", key, "; ".join(errs)))
        if self.lookahead(True)[0] in (_END, ","):
            op = op or "exists"
        if op:
            return LabelRequirement(key, op)
        tok, lit = self.consume(False)
        if tok not in ("in", "notin", "=", "==", "!=", ">", "<"):
            raise SelectorError(f"found '{lit}', expected: in, notin, =, ==, !=, gt, lt")
        op = "=" if tok == "==" else tok
        values = self.values() if op in ("in", "notin") else self.exact_value()
        return _new_requirement(key, op, sorted(values))

    def values(self) -> set[str]:
        tok, lit = self.consume(True)
        if tok != "(":
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead(True)
        if tok == ")":
            self.consume(True)
            return {""}  # "()" is the set of the empty value
        if tok not in (_ID, ","):
            raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        found = self.identifiers()
        if self.consume(True)[0] != ")":
            raise SelectorError(f"found '{lit}', expected: ')'")
        return found

    def identifiers(self) -> set[str]:
        found: set[str] = set()
        while True:
            tok, lit = self.consume(True)
            if tok == _ID:
                found.add(lit)
                after, after_lit = self.lookahead(True)
                if after == ",":
                    continue
                if after == ")":
                    return found
                raise SelectorError(f"found '{after_lit}', expected: ',' or ')'")
            if tok == ",":
                if not found:
                    found.add("")  # "(,"
                after = self.lookahead(True)[0]
                if after == ")":
                    found.add("")  # ",)"
                    return found
                if after == ",":
                    self.consume(True)
                    found.add("")  # ",,"
                continue
            raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        if self.lookahead(True)[0] in (_END, ","):
            return {""}
        tok, lit = self.consume(True)
        if tok == _ID:
            return {lit}
        raise SelectorError(f"found '{lit}', expected: identifier")


def _new_requirement(key: str, op: str, values: list[str]) -> LabelRequirement:
    """labels.NewRequirement's value checks (the key was checked while parsing)."""
    errs: list[str] = []
    if op in (">", "<"):
        errs += [
            _invalid(f"values[{i}]", v, "for 'Gt', 'Lt' operators, the value must be an integer")
            for i, v in enumerate(values)
            if not _INT64.fullmatch(v)
        ]
    for i, value in enumerate(values):
        if problems := _label_value_errors(value):
            errs.append(_invalid(f"values[{i}][{key}]", value, "; ".join(problems)))
    if errs:
        raise SelectorError(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
    return LabelRequirement(key, op, tuple(values))


def parse_label_selector(text: str | None) -> list[LabelRequirement]:
    if text is None:
        return []
    return _LabelParser(text).parse()


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
