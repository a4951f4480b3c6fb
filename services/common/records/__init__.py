"""Kafka's v2 record batches (magic 2): the one codec of the broker, its tools and its tests.
Modules, each importing only those before it: :mod:`.record_batch` (the batch header, all the
produce and fetch paths use), :mod:`.compression`, :mod:`.record` (the records inside a batch,
and whole batches of them) and :mod:`.control_records` (transaction markers).
"""
