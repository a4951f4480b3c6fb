"""The SparkSession the jobs use: local[*] unless told otherwise, with the kbroker_metrics data
source registered and this repository importable by the Python workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def _export_python_path() -> None:
    # Local-mode Python workers inherit the driver's environment, not its sys.path: they must
    # find the `spark` and `services` packages (and the generated stubs) to read partitions.
    paths = [str(REPO_ROOT), str(REPO_ROOT / "proto" / "gen")]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *current]))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_session(
    app_name: str,
    master: str | None = None,
    shuffle_partitions: int | None = None,
    ui: bool = True,
) -> Any:
    """A session with ``format("kbroker_metrics")`` registered.

    ``master`` None keeps what spark-submit set; plain ``python`` then runs on local[*] (Spark's
    own default).
    """
    _export_python_path()
    from pyspark.sql import SparkSession

    from spark.datasource import register

    builder = SparkSession.builder.appName(app_name).config(
        "spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    if shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if not ui:
        builder = builder.config("spark.ui.enabled", "false")
    session = builder.getOrCreate()
    register(session)
    return session
