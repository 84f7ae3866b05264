"""The Python examples of README.md, docs/jobs.md and docs/dataflow.md run as
written and give their reference results (each example asserts it).

Markers in the Markdown, on the line before a fenced block:
``<!-- runnable -->`` runs the python block as a script;
``<!-- file: PATH -->`` writes the block to PATH in a fresh directory that
is on the scripts' import path (the modules a script imports);
``<!-- runnable: pytest FILE -->`` (on its own) runs pytest on such a file.
The README's example talks to a real local cluster: its address replaces
``127.0.0.1:7400``.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gridstream.local import REPO_ROOT, LocalCluster

pytestmark = pytest.mark.integration

_MARKED = re.compile(r"<!-- (runnable|file: (?P<path>[\w./-]+)) -->\n```python\n(?P<code>.*?)```",
                     re.S)
_PYTEST = re.compile(r"<!-- runnable: pytest (?P<path>[\w./-]+) -->")


@dataclass
class Example:
    """One marked block: a script to run, a file to write, or a pytest run."""

    kind: str  # "script", "file" or "pytest"
    code: str = ""
    path: str = ""


def examples(document: str) -> list[Example]:
    """The marked blocks of a Markdown document, in order."""
    text = (REPO_ROOT / document).read_text()
    found: list[tuple[int, Example]] = []
    for match in _MARKED.finditer(text):
        if match.group("path"):
            found.append((match.start(), Example("file", match.group("code"),
                                                 match.group("path"))))
        else:
            found.append((match.start(), Example("script", match.group("code"))))
    found.extend((m.start(), Example("pytest", path=m.group("path")))
                 for m in _PYTEST.finditer(text))
    return [example for _, example in sorted(found, key=lambda item: item[0])]


async def run(argv: list[str], cwd: Path, modules: Path) -> str:
    """Runs a command with ``modules`` and the repository on the import path;
    its output, or a failure that shows it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSTREAM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(modules), str(REPO_ROOT)])
    env["PYTHONFAULTHANDLER"] = "1"  # a native crash shows every thread's stack
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=str(cwd), env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode == 0, f"{argv[-1][:400]}\n---\n{out.decode()}"
    return out.decode()


async def run_document(document: str, tmp_path: Path, address: str | None = None
                       ) -> list[str]:
    """Writes the document's files, runs its scripts and pytest runs in
    order; the outputs of the scripts."""
    outputs = []
    for example in examples(document):
        if example.kind == "file":
            target = tmp_path / example.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(example.code)
        elif example.kind == "pytest":
            await run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       example.path], tmp_path, tmp_path)
        else:
            code = example.code
            if address is not None:
                code = code.replace("127.0.0.1:7400", address)
            outputs.append(await run([sys.executable, "-c", code], REPO_ROOT, tmp_path))
    return outputs


def test_every_document_has_its_examples_marked() -> None:
    kinds = {doc: [e.kind for e in examples(doc)]
             for doc in ("README.md", "docs/jobs.md", "docs/dataflow.md")}
    assert kinds["README.md"] == ["script"]
    assert kinds["docs/jobs.md"].count("script") >= 1
    assert kinds["docs/dataflow.md"] == ["file", "file", "script", "file", "pytest", "file",
                                         "script"]


async def test_the_readme_example_gives_the_taxi_reference(cluster: LocalCluster,
                                                           tmp_path: Path) -> None:
    outputs = await run_document("README.md", tmp_path, cluster.scheduler_address)
    assert outputs == ["10000 devices tracked, as the reference\n"]


async def test_the_jobs_guide_examples_run(tmp_path: Path) -> None:
    outputs = await run_document("docs/jobs.md", tmp_path)
    assert outputs[-1] == "2\n"


async def test_the_dataflow_guide_examples_run(tmp_path: Path) -> None:
    outputs = await run_document("docs/dataflow.md", tmp_path)
    assert outputs == ["{'ann': 12} {'ann': 1, 'bob': 1}\n",
                       "[{'user': 'ann', 'bought_at': 20}, "
                       "{'user': 'bob', 'abandoned_at': 40, 'seen': 1003.0}]\n"]  # timers
