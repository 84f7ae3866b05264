"""The Spark bridge: ``format("gridstream")`` for Spark Structured Streaming.

Why: Spark users already land device data with Structured Streaming; this
lets a query feed a gridstream job straight from the executors, exactly once
across Spark restarts, and read a job's results back as a DataFrame.

    spark = spark_bridge.build_session()          # or spark_bridge.register(spark)
    (df.writeStream.format("gridstream")
       .option("scheduler", "127.0.0.1:7400").option("job", job_id)
       .option("key", "device").option("checkpointLocation", "/ckpt").start())
"""

from spark_bridge.session import build_session
from spark_bridge.sink import (
    BridgeError,
    GridstreamDataSource,
    foreach_batch_writer,
    register,
)

__all__ = ["BridgeError", "GridstreamDataSource", "build_session", "foreach_batch_writer",
           "register"]
