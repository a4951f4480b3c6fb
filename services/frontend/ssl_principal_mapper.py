"""Kafka's ``ssl.principal.mapping.rules`` (KIP-371, Kafka's SslPrincipalMapper): how the
subject of a client certificate, as an RFC 2253 distinguished name, becomes a principal name.

    rules = RULE ("," RULE)*
    RULE  = "DEFAULT"                                   the whole DN, unchanged
          | "RULE:" PATTERN "/" REPLACEMENT "/" ["L"|"U"]

A RULE applies when PATTERN matches the whole DN; the name is then the DN with every match of
PATTERN replaced by REPLACEMENT (``$1`` names a group; ``$N`` past the last group is kept
literally, as Kafka does), lower- or upper-cased with L or U. Rules are tried in order; the
first that applies names the principal, and a DN no rule applies to has no principal (the
client's authentication fails).

    RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT
        CN=kafka-client,OU=ServiceUsers,O=Org  ->  kafka-client
        CN=alice,O=Org                          ->  CN=alice,O=Org

Patterns are Python regular expressions, which agree with Java's on the constructs such rules
use (groups, classes, lazy quantifiers, anchors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE_PATTERN)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


class NoMatchingRuleError(Exception):
    """No rule applies to a DN."""


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        match = self.pattern.fullmatch(dn)
        if match is None:
            return None
        groups = self.pattern.groups

        def group_text(m: re.Match[str]) -> str:
            text = m.group(1)
            index = int(text)
            if text.startswith("0"):
                return m.group(0)
            # $123 with fewer groups reads as $12 then a literal 3, and so on (Kafka's rule).
            digits = text
            while index > groups and index >= 10:
                index //= 10
                digits = digits[:-1]
            if index > groups:
                return m.group(0)
            return "\x00" + str(index) + "\x00" + text[len(digits):]

        # Translate Java's $N into Python's \g<N>, literal text escaped.
        parts = _BACK_REFERENCE.sub(group_text, self.replacement).split("\x00")
        template = "".join(
            (f"\\g<{part}>" if i % 2 else part.replace("\\", "\\\\"))
            for i, part in enumerate(parts))
        result = self.pattern.sub(template, dn)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


class SslPrincipalMapper:
    """Parsed mapping rules; :meth:`name` maps a DN. ValueError for rules that do not parse."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self._rules: list[_Rule] = []
        for match in _RULE_SPLITTER.finditer((rules or "DEFAULT").strip()):
            rule = match.group(1)
            parsed = _RULE_PARSER.match(rule)
            if parsed is None or parsed.end() != len(rule):
                raise ValueError(f"Invalid rule: {rule}")
            if parsed.group(1) is not None:
                self._rules.append(_Rule(None))
            elif parsed.group(2) is not None:
                try:
                    pattern = re.compile(parsed.group(2))
                except re.error as e:
                    raise ValueError(f"Invalid rule: {rule}: {e}") from None
                self._rules.append(_Rule(pattern, parsed.group(4), parsed.group(6)))
            # anything else is an empty rule, ignored (as Kafka does)

    def name(self, dn: str) -> str:
        """The principal name of ``dn``; NoMatchingRuleError when no rule applies."""
        for rule in self._rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRuleError(f"No rules apply to {dn}")
