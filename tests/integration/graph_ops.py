"""Functions of the graph jobs the integration tests run on a real cluster
(module-level, so workers import them; tests.integration is one of the test
cluster's job modules)."""

from __future__ import annotations

from typing import Any

from gridstream.dataflow import Dataflow


def parse(line: str) -> dict[str, Any]:
    user, kind, amount = line.split(",")
    return {"user": user, "kind": kind, "amount": int(amount)}


def is_kind(click: dict[str, Any], kind: str) -> bool:
    return bool(click["kind"] == kind)


def user_of(click: dict[str, Any]) -> str:
    return str(click["user"])


def add_amount(total: int, click: dict[str, Any]) -> int:
    return total + int(click["amount"])


def count(n: int, _click: dict[str, Any]) -> int:
    return n + 1


def label(click: dict[str, Any]) -> str:
    return f"{click['user']}:{click['kind']}:{click['amount']}"


def clicks() -> Dataflow:
    """Every parsed click to an append sink (fan-out); buys keyed and summed
    per user (latest sink); buys and views unioned, counted per user (a keyed
    union) and labelled (an unkeyed union) into an append sink."""
    flow = Dataflow("clickgraph", partitions=8, window_size=500)
    parsed = flow.source().map("parse", parse)
    parsed.sink("raw", mode="append")
    buys = parsed.filter("buys", is_kind, params={"kind": "buy"})
    views = parsed.filter("views", is_kind, params={"kind": "view"})
    buys.key_by(user_of).reduce("spend", add_amount, initial=0).sink("spent")
    both = buys.union(views)
    both.key_by(user_of).reduce("touch", count, initial=0).sink("touched")
    both.map("label", label).sink("labelled", mode="append")
    return flow


def lines(n: int) -> tuple[list[str], list[str]]:
    """``n`` click lines over 37 users (every 97th one unparsable), and their users."""
    kinds = ("buy", "view", "home")
    users = [f"u{i % 37}" for i in range(n)]
    out = [f"{user},{kinds[i % 3]},{'x' if i % 97 == 5 else i % 11}"
           for i, user in enumerate(users)]
    return users, out
