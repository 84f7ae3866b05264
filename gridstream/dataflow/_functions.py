"""User functions as the cluster names them: ``package.module:function``.

No code crosses the wire: a worker imports each function by its path. A
module-level function object is turned into its path here, and whatever a
worker could never import by path (a lambda, a closure, a nested function,
a method, a function of the script being run, a partial) is refused with a
message that says what to write instead, when the operator is added.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from gridstream.errors import InvalidArgument

FunctionLike = str | Callable[..., Any]
"""An import path ``"package.module:function"`` or a module-level function."""


def function_path(fn: FunctionLike, where: str) -> str:
    """The import path of ``fn``: a string is returned as it is (the stage
    check judges its shape); a function must be reachable as
    ``module.<its name>`` so that every worker finds the same object."""
    if isinstance(fn, str):
        return fn
    if isinstance(fn, functools.partial):
        raise InvalidArgument(f"{where}: a functools.partial cannot travel to the workers; "
                              "name the function and give its arguments as params={...}")
    if isinstance(fn, types.MethodType):
        raise InvalidArgument(f"{where}: {fn.__qualname__} is a bound method; workers import "
                              "functions by path: use a module-level function")
    if not callable(fn):
        raise InvalidArgument(f"{where}: {fn!r} is neither an import path "
                              "'package.module:function' nor a function")
    name = getattr(fn, "__name__", "")
    qualname = getattr(fn, "__qualname__", name)
    module = getattr(fn, "__module__", None)
    if name == "<lambda>":
        raise InvalidArgument(f"{where}: a lambda has no import path a worker could use; "
                              "define it with def at the top level of a module")
    if "<locals>" in qualname or getattr(fn, "__closure__", None):
        raise InvalidArgument(f"{where}: {qualname} is defined inside a function (a closure "
                              "or nested function); workers import functions by path, so "
                              "define it at the top level of a module and pass what it "
                              "captured as params={...}")
    if "." in qualname:
        raise InvalidArgument(f"{where}: {qualname} is a method; workers resolve "
                              "'module:function', so use a module-level function")
    if not isinstance(module, str) or module == "__main__":
        raise InvalidArgument(f"{where}: {qualname} is defined in the script being run "
                              "(__main__), which workers cannot import; move it into a "
                              "module (e.g. myjobs/ops.py) and import it from there")
    if getattr(sys.modules.get(module), name, None) is not fn:
        raise InvalidArgument(f"{where}: {module}.{name} is not this function (renamed or "
                              "wrapped by a decorator without functools.wraps?); name the "
                              "module-level function a worker will import")
    return f"{module}:{name}"


def check_call(fn: FunctionLike, positional: int, params: Mapping[str, Any],
               where: str) -> None:
    """Checks, for a function object, that it accepts ``positional`` values
    and the params as keyword arguments, as the worker will call it; an
    import path is only resolved on the workers (and by the local runner)."""
    if isinstance(fn, str):
        return
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature
        return
    try:
        signature.bind(*([None] * positional), **dict(params))
    except TypeError as exc:
        given = ", ".join(sorted(params)) or "no params"
        raise InvalidArgument(f"{where}: {getattr(fn, '__qualname__', fn)}{signature} cannot "
                              f"be called with {positional} value(s) and {given}: {exc}"
                              ) from None
