"""A fetch waiting for data (Kafka's ``DelayedFetch``), as the purgatory sees it.

The handler parks a fetch that read fewer than ``min_bytes`` on every partition it reads, keyed
``topic-partition``, each with the threshold "a high watermark past the one I read". Bytes are
counted where the records are, in the handler: the purgatory's part of Kafka's rule is to wake
the fetch as soon as any of its partitions may have more to give, so it completes when

- any partition's reported position reaches its threshold (an append moved the high watermark),
- or any partition reports an error after the fetch was parked (the leader moved, the partition
  is gone, the fetch offset left the log), which the handler turns into that partition's error;

and the handler reads again, answering if it now has ``min_bytes`` or parking again for what is
left of ``max_wait_ms``. Otherwise it expires after ``max_wait_ms`` (the timeout) and the
handler answers with what is there. Maps onto Await with ``require_all`` false.
"""

from __future__ import annotations

from .delayed_await import DelayedAwait


class DelayedFetch(DelayedAwait):
    """A fetch parked until one of its partitions moves or fails, or ``max_wait_ms``."""

    KIND = "fetch"
