"""Builds SparkSessions whose Python workers can import gridstream.

Why: the sink runs the SDK inside the executors' Python workers, so they must
use the venv's interpreter (PYSPARK_PYTHON) and see the repository on their
PYTHONPATH; a local session must also bind to loopback and must never try to
download jars (Maven is unreachable here).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def python_env() -> dict[str, str]:
    """The environment the executors' Python workers need."""
    path = os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {"PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path}


def build_session(master: str = "local[2]", app_name: str = "gridstream-spark",
                  conf: dict[str, str] | None = None) -> Any:
    """A SparkSession (created or reused) set up for the gridstream bridge, with
    ``format("gridstream")`` registered."""
    from pyspark.sql import SparkSession

    from spark_bridge.sink import register

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env = python_env()
    os.environ.setdefault("PYSPARK_PYTHON", env["PYSPARK_PYTHON"])
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pyspark.python", env["PYSPARK_PYTHON"])
        .config("spark.executorEnv.PYSPARK_PYTHON", env["PYSPARK_PYTHON"])
        .config("spark.executorEnv.PYTHONPATH", env["PYTHONPATH"])
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def activate(spark: Any) -> None:
    """Makes ``spark`` the active session of the calling thread's JVM thread.

    Why: Spark looks a Python data source up through the JVM thread's active
    session; a thread other than the one that built the session (e.g. one from
    ``asyncio.to_thread``) has none, and ``format("gridstream")`` is then
    "not found". Call this first in such threads."""
    jvm = spark.sparkContext._jvm
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
