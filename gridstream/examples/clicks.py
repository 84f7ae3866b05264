"""A clickstream: users click pages; the job branches to an append files sink
and to keyed aggregates, and a reference computes what it must give.

Each click is a JSON line ``{"user": "u007", "page": "/docs/3", "n": 12,
"ms": 480}``, where ``n`` numbers each user's clicks 1, 2, 3... in the order
the user made them; clicks are sent keyed by user, so a user's clicks keep
that order. The job (:func:`flow`):

- ``parse`` (map): the JSON text to a dict;
- ``clicks`` (files sink): every parsed click, exactly once, as JSON lines
  or Parquet under a directory (:mod:`gridstream.filesink` reads them);
- ``per_user`` (reduce by user) → sink ``users``: the order-sensitive
  summary of the history checker over ``n`` (count, last, inversions, sum,
  sum of squares), so :func:`gridstream.checker.check_history` tells a lost,
  doubled or reordered click apart, per user;
- ``per_page`` (reduce by page) → sink ``pages``: clicks and milliseconds
  spent per page, ``[clicks, ms]``.

``gridstream demo clicks`` runs it on a local cluster and checks every sink
and the files against :func:`reference`.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

from gridstream.dataflow import Dataflow
from gridstream.examples.history import EMPTY, fold

PAGES = 40
"""Pages the generator picks from."""


def generate(records: int, users: int = 200, seed: int = 0) -> tuple[list[str], list[str]]:
    """(user of each click, the clicks as JSON lines): a fixed seed gives the
    same stream every time; each user's clicks are numbered from 1."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    keys: list[str] = []
    lines: list[str] = []
    for _ in range(records):
        user = f"u{rng.randrange(users):04d}"
        counts[user] = counts.get(user, 0) + 1
        page = f"/page/{min(int(rng.expovariate(0.15)), PAGES - 1)}"
        keys.append(user)
        lines.append(json.dumps({"user": user, "page": page, "n": counts[user],
                                 "ms": rng.randrange(50, 5_000)}))
    return keys, lines


def parse(text: str | dict[str, Any]) -> dict[str, Any]:
    """A click's JSON line to a dict (a dict as it is: ``gridstream send``
    of a JSON-lines file or directory sends each line parsed)."""
    click = text if isinstance(text, dict) else json.loads(text)
    if not isinstance(click, dict):
        raise ValueError("a click is a JSON object")
    return click


def user_of(click: dict[str, Any]) -> str:
    """Key of ``per_user``."""
    return str(click["user"])


def page_of(click: dict[str, Any]) -> str:
    """Key of ``per_page``."""
    return str(click["page"])


def per_user(summary: list[int], click: dict[str, Any]) -> list[int]:
    """The history checker's fold over the user's click numbers."""
    return fold(summary, [click["user"], click["n"]])


def per_page(total: list[int], click: dict[str, Any]) -> list[int]:
    """[clicks, milliseconds] of a page (a new list: never mutated)."""
    return [total[0] + 1, total[1] + int(click["ms"])]


def flow(path: str | os.PathLike[str], fmt: str = "jsonl", partitions: int = 0,
         window_size: int = 0) -> Dataflow:
    """The clicks job, its files sink writing under ``path`` (a directory
    every worker can write)."""
    job = Dataflow("clicks", partitions=partitions, window_size=window_size)
    clicks = job.source().map("parse", parse)
    clicks.file_sink("clicks", path, format=fmt)
    clicks.key_by(user_of).reduce("per_user", per_user, initial=list(EMPTY)).sink("users")
    clicks.key_by(page_of).reduce("per_page", per_page, initial=[0, 0]).sink("pages")
    return job


def reference(lines: list[str]) -> dict[str, Any]:
    """What each sink must hold: ``users`` and ``pages`` per key, and
    ``clicks``, the parsed clicks (compare as a multiset: the files hold
    them partition by partition)."""
    users: dict[str, Any] = {}
    pages: dict[str, Any] = {}
    clicks = []
    for text in lines:
        click = parse(text)
        clicks.append(click)
        users[click["user"]] = per_user(users.get(click["user"], list(EMPTY)), click)
        pages[click["page"]] = per_page(pages.get(click["page"], [0, 0]), click)
    return {"users": users, "pages": pages, "clicks": clicks}


def sent_counts(keys: list[str]) -> dict[str, int]:
    """Clicks sent per user (what :func:`gridstream.checker.check_history` needs)."""
    counts: dict[str, int] = {}
    for user in keys:
        counts[user] = counts.get(user, 0) + 1
    return counts


def check_files(records: list[Any], lines: list[str]) -> str:
    """'' when the files hold every click exactly once, else what is wrong."""
    def ident(click: Any) -> str:
        return json.dumps(click, sort_keys=True)

    expected: dict[str, int] = {}
    for text in lines:
        name = ident(parse(text))
        expected[name] = expected.get(name, 0) + 1
    got: dict[str, int] = {}
    for record in records:
        name = ident(record)
        got[name] = got.get(name, 0) + 1
    if got == expected:
        return ""
    missing = sum(max(0, n - got.get(k, 0)) for k, n in expected.items())
    doubled = sum(max(0, n - expected.get(k, 0)) for k, n in got.items())
    return (f"files: {len(records)} records instead of {len(lines)} ({missing} missing, "
            f"{doubled} extra)")
