"""Producer ids for idempotent producers, handed out in blocks (KIP-730; Kafka's
``ProducerIdControlManager``): the controller keeps one number, the first id of the next block,
and each request takes the next :data:`PRODUCER_ID_BLOCK_SIZE` ids. Handlers then give out
ids of their block one by one without asking again.

The number lives in the metadata image (``MetadataImage.next_producer_id``) and is saved with it
before a block is answered (see ``Controller.allocate_producer_ids``), so an id is never handed
out twice, whatever restarts; a block whose holder dies unused is lost, as in Kafka. Moving the
metadata into a replicated log moves this number with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import ErrorCode, KafkaError

from .metadata import MetadataImage

# Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE.
PRODUCER_ID_BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerIdBlock:
    """Ids ``first_id`` .. ``first_id + size - 1``."""

    first_id: int
    size: int

    @property
    def last_id(self) -> int:
        return self.first_id + self.size - 1

    @property
    def next_block_first_id(self) -> int:
        return self.first_id + self.size


def next_block(image: MetadataImage) -> ProducerIdBlock:
    """The block the next request gets. Raises UNKNOWN_SERVER_ERROR when the int64 id space
    is used up (Kafka's answer)."""
    first = image.next_producer_id
    if first > MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE:
        raise KafkaError(ErrorCode.unknown_server_error,
                         "every producer id has been handed out")
    return ProducerIdBlock(first_id=first, size=PRODUCER_ID_BLOCK_SIZE)
