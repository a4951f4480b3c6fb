"""Producer ids for idempotent producers, handed out in blocks (KIP-730; Kafka's
``ProducerIdControlManager``): the image keeps one number, the first id of the next block
(``MetadataImage.next_producer_id``), and each request takes the next
:data:`PRODUCER_ID_BLOCK_SIZE` ids. Handlers then give out ids of their block one by one.

The number is saved before a block is answered, so an id is never handed out twice, whatever
restarts; a block whose holder dies unused is lost, as in Kafka. Clients never see the number:
taking a block makes no new metadata version.
"""

from __future__ import annotations

import logging

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode, KafkaError

from ..metadata import MetadataImage
from .core import ControllerCore

log = logging.getLogger(__name__)

# Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE.
PRODUCER_ID_BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1


def take_block(image: MetadataImage) -> tuple[MetadataImage, int]:
    """The image after the next block is taken, and that block's first id. Raises
    UNKNOWN_SERVER_ERROR when the int64 id space is used up (Kafka's answer)."""
    first = image.next_producer_id
    if first > MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE:
        raise KafkaError(ErrorCode.unknown_server_error,
                         "every producer id has been handed out")
    return image.replace(next_producer_id=first + PRODUCER_ID_BLOCK_SIZE), first


class ProducerIdControlManager:
    def __init__(self, core: ControllerCore) -> None:
        self._core = core

    async def allocate(self, request: pb.AllocateProducerIdsRequest
                       ) -> pb.AllocateProducerIdsResponse:
        """The next block, saved before it is answered; nothing is handed out when ids are
        exhausted or the save fails."""
        try:
            first = await self._core.commit(take_block, bump=False)
        except KafkaError as exc:
            return pb.AllocateProducerIdsResponse(error_code=exc.errno,
                                                  error_message=exc.message or "")
        except OSError as exc:
            log.error("cannot save a producer id block: %s", exc)
            return pb.AllocateProducerIdsResponse(
                error_code=ErrorCode.unknown_server_error.value, error_message=str(exc))
        log.info("producer ids %d-%d handed to %s", first, first + PRODUCER_ID_BLOCK_SIZE - 1,
                 request.requester or "an unnamed requester")
        return pb.AllocateProducerIdsResponse(producer_id_start=first,
                                              producer_id_len=PRODUCER_ID_BLOCK_SIZE)
