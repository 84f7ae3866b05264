"""Build a gridstream job in Python as a graph of operators.

    from gridstream.dataflow import Dataflow
    from myjobs import ops                       # module-level functions

    flow = Dataflow("clicks")
    clicks = flow.source().map("parse", ops.parse)
    clicks.sink("raw", mode="append")           # every record
    clicks.filter("buys", ops.is_kind, params={"kind": "buy"}) \\
          .key_by(ops.user_of).reduce("spent", ops.add_amount, initial=0) \\
          .sink("spent")                        # latest per user
    job = flow.job()                            # a validated JobSpec

Functions travel by import path, never as code; parameters travel as JSON
data and reach the function as keyword arguments. ``docs/dataflow.md`` has
the whole story; :func:`gridstream.testing.run_local` runs a graph in one
process.
"""

from gridstream.dataflow._flow import Dataflow
from gridstream.dataflow._functions import FunctionLike, function_path
from gridstream.dataflow._stream import KeyedStream, Stream, WindowedStream

__all__ = ["Dataflow", "FunctionLike", "KeyedStream", "Stream", "WindowedStream", "function_path"]
