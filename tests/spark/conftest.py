"""Spark test fixtures: the end-to-end local cluster and one SparkSession for the package."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark.session import get_session

    session = get_session("kbroker-tests", master="local[2]", shuffle_partitions=2, ui=False)
    try:
        yield session
    finally:
        session.stop()
