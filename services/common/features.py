"""The cluster features this broker finalizes (KIP-584), in one place: what ApiVersions v3+
advertises (SupportedFeatures and FinalizedFeatures), and what the transaction coordinator
and the produce path serve.

Only ``transaction.version`` is offered, at level 2 (transactions v2, KIP-890 part 2: the
partition add implied by Produce v12 and TxnOffsetCommit v5, and the epoch bumped at every
EndTxn v5), as a Kafka 4 broker with it enabled. Clients choose it by the finalized level:
Kafka's Java ``TransactionManager`` uses transactions v2 once the finalized
``transaction.version`` is at least 2, read from the ApiVersions answer with the highest
``FinalizedFeaturesEpoch`` (so the epoch must be 0 or more for a client to take it at all).
Other features (``metadata.version``, ``group.version``) are not advertised: no client picks
a protocol by them that this broker serves differently.
"""

from __future__ import annotations

from dataclasses import dataclass

TRANSACTION_VERSION = "transaction.version"

# Kafka's TransactionVersion levels: TV_0 (and TV_1) the original protocol, TV_2 transactions
# v2 (KIP-890 part 2).
TRANSACTION_VERSION_MIN = 0
TRANSACTION_VERSION_MAX = 2
# The level this cluster runs at (a constant: features are never altered here).
FINALIZED_TRANSACTION_VERSION = 2
# The epoch of the finalized features; they never change, so one epoch serves for ever.
FINALIZED_FEATURES_EPOCH = 0


@dataclass(frozen=True, slots=True)
class Feature:
    """One feature: the levels supported and the level finalized."""

    name: str
    min_level: int
    max_level: int
    finalized_level: int


FEATURES: tuple[Feature, ...] = (
    Feature(TRANSACTION_VERSION, TRANSACTION_VERSION_MIN, TRANSACTION_VERSION_MAX,
            FINALIZED_TRANSACTION_VERSION),
)

