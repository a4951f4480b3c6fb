"""Regular expression subscriptions of consumer groups (Kafka's ``TopicRegexResolver``): a
member's ``SubscribedTopicRegex`` is compiled with RE2, as Kafka compiles it with RE2/J, and
matched against whole topic names.

Kafka's syntax, not Python's: RE2 has no lookaround (``(?=``, ``(?!``, ``(?<=``, ``(?<!``), no
backreferences (``\\1``, ``(?P=name)``), no possessive quantifiers or atomic groups (``a*+``,
``(?>...)``), no conditionals, no ``\\Z`` and no verbose flag ``(?x)``, and repetition counts
stop at 1000; such expressions are INVALID_REGULAR_EXPRESSION. It does have what Python's
``re`` lacks or reads otherwise: ``\\pL`` and ``\\p{Greek}`` classes, ``[[:alpha:]]``, ``\\Q...\\E``
quoting, ``\\z``, and ``(?U)`` (ungreedy, where Python's means Unicode). Matching takes time
linear in the name, whatever the expression, so a member cannot stall a handler with one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import re2

# A filter of topic names: those the member may DESCRIBE (Kafka's authorizer on the topics a
# regular expression matched); None when no authorizer is on.
TopicFilter = Callable[[Iterable[str]], set[str]] | None

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad expression is the member's error, not the handler's


class InvalidRegexError(ValueError):
    """Not an expression RE2 compiles; the message says why (RE2's words)."""


@functools.lru_cache(maxsize=1024)
def compile_regex(regex: str) -> re2._Regexp:  # type: ignore[name-defined]
    """The compiled expression. Raises :class:`InvalidRegexError`."""
    try:
        return re2.compile(regex, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise InvalidRegexError(str(reason)) from None


def matching_topics(regex: str, topics: Iterable[str], describable: TopicFilter = None,
                    ) -> frozenset[str]:
    """The topics whose whole name matches ``regex`` (none if it does not compile), less
    those ``describable`` leaves out."""
    try:
        pattern = compile_regex(regex)
    except InvalidRegexError:
        return frozenset()  # checked when it was subscribed
    matched = {name for name in topics if pattern.fullmatch(name) is not None}
    if describable is not None and matched:
        matched = describable(matched)
    return frozenset(matched)
