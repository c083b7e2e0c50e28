"""``POST /debug/what-if``: a manifest in, the dry plan's answer out.

The body is the manifest as a user would ``kubectl apply`` it (YAML, several documents, or
JSON), at most :data:`MAX_BODY` bytes; it is parsed here, handed to the core
(:meth:`coscheduling.Coscheduler.what_if`), and the dry plan is run in slices with the event
loop let go between them, so a what-if never holds the verbs up longer than a verb does. The
answer goes on the wire as :class:`WhatIfAnswer` (pydantic), with every reason in the words
``explain`` uses, and as the text the CLI and the page print (:func:`as_text`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
import yaml
from fastapi import Request
from pydantic import BaseModel, ConfigDict

from coscheduling import Offload, Outcome, Proposal, Verdict, WhatIfError

from ..kube.errors import BadRequest
from ..render import render, render_nofit

if TYPE_CHECKING:
    from ..service import Lockstep

__all__ = ["EXIT_CODES", "MAX_BODY", "WhatIfAnswer", "as_text", "parse_manifest", "read_body",
           "what_if"]

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML has it (tens of times faster than the pure one)."""

MAX_BODY = 256 << 10
"""Bytes of manifest one what-if reads at most (a job and its groups are a few KiB; a
quarter MiB of YAML takes libyaml about half a second, in a thread)."""
MAX_DOCUMENTS = 256
"""YAML documents read at most before the core's own bound (``whatif.MAX_OBJECTS``)."""

EXIT_CODES = {Verdict.FITS.value: 0, Verdict.PREEMPTS.value: 1, Verdict.WAITS.value: 1,
              Verdict.NEVER.value: 2}
"""``lockstep explain --what-if``'s exit status per verdict (bad input: 2 too)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class PlacedModel(_Model):
    pod: str
    node: str
    topology: dict[str, str]
    pinnedAtCreation: bool


class VictimsModel(_Model):
    gangs: list[str]
    pods: list[str]
    evicted: int
    gpusFreed: int


class EarliestModel(_Model):
    inSeconds: float
    event: str


class OutcomeModel(_Model):
    unit: str
    gang: bool
    verdict: str
    members: int
    placed: list[PlacedModel]
    gated: list[str]
    placedWithin: str | None
    victims: VictimsModel | None
    reason: str | None
    hints: list[str]
    earliest: EarliestModel | None


class WhatIfAnswer(_Model):
    """The wire shape of a what-if's answer (``-o json``)."""

    verdict: str
    exitCode: int
    outcomes: list[OutcomeModel]
    notes: list[str]
    text: str = ""
    """The answer as :func:`as_text` words it (the CLI prints it, the page shows it)."""


def _reason(o: Outcome) -> str | None:
    parts = []
    if o.reason is not None:
        parts.append(render(o.reason))
    elif o.nofit is not None:
        parts.append(render_nofit(o.nofit))
    if o.why and not any(o.why in p for p in parts):  # a reason may carry it already
        parts.append(o.why)
    return "; ".join(parts) or None


def _outcome(o: Outcome) -> OutcomeModel:
    v = o.victims
    return OutcomeModel(
        unit=o.unit, gang=o.gang, verdict=o.verdict.value, members=o.members,
        placed=[PlacedModel(pod=p.pod, node=p.node, topology=dict(p.domains),
                            pinnedAtCreation=p.pinned) for p in o.placed],
        gated=list(o.gated), placedWithin=o.level,
        victims=VictimsModel(gangs=list(v.gangs), pods=list(v.pods), evicted=v.evicted,
                             gpusFreed=v.gpus) if v is not None else None,
        reason=_reason(o), hints=list(o.hints),
        earliest=EarliestModel(inSeconds=o.earliest.seconds, event=o.earliest.event)
        if o.earliest is not None else None)


def answer_model(p: Proposal) -> WhatIfAnswer:
    got = WhatIfAnswer(verdict=p.verdict.value, exitCode=EXIT_CODES[p.verdict.value],
                       outcomes=[_outcome(o) for o in p.outcomes], notes=list(p.notes))
    return got.model_copy(update={"text": as_text(got)})


def parse_manifest(body: bytes) -> list[Any]:
    """The manifest's documents; a 4xx naming what is wrong for anything else."""
    if len(body) > MAX_BODY:
        raise BadRequest(413, f"the manifest is {len(body)} bytes, more than {MAX_BODY}",
                         ["body"])
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise BadRequest(400, "the manifest is not UTF-8 text", ["body"]) from None
    docs: list[Any] = []
    if text.lstrip()[:1] in ("{", "["):  # JSON, as scripts send it: parsed in C, at once
        try:
            got = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # YAML's flow style starts so too
        else:
            return _checked(got if isinstance(got, list) else [got])
    try:
        for doc in yaml.load_all(text, Loader=_LOADER):
            docs.append(doc)
            if len(docs) > MAX_DOCUMENTS:
                raise BadRequest(400, f"more than {MAX_DOCUMENTS} YAML documents", ["body"])
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise BadRequest(400, f"malformed YAML{at}: {problem}", ["body"]) from None
    except ValueError as e:  # a scalar the parser will not build (a 5,000-digit number)
        raise BadRequest(400, f"malformed YAML: {str(e)[:200]}", ["body"]) from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise BadRequest(400, f"the manifest nests deeper than {MAX_DEPTH} levels",
                         ["body"]) from None
    return _checked(docs)


def _checked(docs: list[Any]) -> list[Any]:
    """The documents, a ``kind: List``'s items in its place; refused when empty or too
    big to walk."""
    _bounded(docs)
    out: list[Any] = []
    for d in docs:
        items = d.get("items") if isinstance(d, dict) and d.get("kind") == "List" else None
        out.extend(items if isinstance(items, list) else [d])
    if not any(d is not None for d in out):
        raise BadRequest(400, "the manifest is empty", ["body"])
    return out


MAX_DEPTH = 64
"""Levels of nesting a manifest may have (a pod's deepest field is about 12 down)."""
MAX_VALUES = 200_000
"""Values a manifest may expand to, YAML aliases counted as often as they are used (a
billion-laughs manifest of a few hundred bytes expands to billions)."""


def _bounded(docs: list[Any]) -> None:
    """Refuse a manifest nested deeper than :data:`MAX_DEPTH` or expanding to more than
    :data:`MAX_VALUES` values, before anything walks it. One pass over its distinct
    objects (an alias is counted from the memo, not walked again)."""
    size: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(docs, 0, False)]
    while stack:
        obj, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            raise BadRequest(400, f"the manifest nests deeper than {MAX_DEPTH} levels", ["body"])
        kids = list(obj.values()) if isinstance(obj, dict) else obj \
            if isinstance(obj, list) else None
        if kids is None or id(obj) in size:
            continue
        if not done:
            stack.append((obj, depth, True))
            stack.extend((k, depth + 1, False) for k in kids)
            continue
        total = 1 + sum(size.get(id(k), 1) for k in kids)
        if total > MAX_VALUES:
            raise BadRequest(400, f"the manifest expands to more than {MAX_VALUES} values "
                                  "(YAML aliases)", ["body"])
        size[id(obj)] = total


async def read_body(request: Request) -> bytes:
    """The request's body, refused (413) past :data:`MAX_BODY` without reading it all."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise BadRequest(413, f"the manifest is {declared} bytes, more than {MAX_BODY}",
                         ["body"])
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(413, f"the manifest is more than {MAX_BODY} bytes", ["body"])
        chunks.append(chunk)
    return b"".join(chunks)


async def what_if(service: Lockstep, body: bytes) -> WhatIfAnswer:
    """Parse (in a thread: a 1 MiB manifest is tens of milliseconds even in C), dry-plan
    in slices (the loop runs between them), and answer."""
    docs = await asyncio.to_thread(parse_manifest, body)
    try:
        run = service.core.what_if(docs, service.clock())
    except WhatIfError as e:
        raise BadRequest(400, str(e), [e.field]) from None
    got = run.advance()
    while not isinstance(got, Proposal):
        if isinstance(got, Offload):  # a big unit's planning, on a snapshot
            got = run.advance(await asyncio.to_thread(got.work))
        else:
            await asyncio.sleep(0)
            got = run.advance()
    return answer_model(got)


def _level(name: str) -> str:
    """A topology level as a person says it (the finest level is one node)."""
    return "node" if name == "hostname" else name


def as_text(a: WhatIfAnswer) -> str:
    """The answer as a person reads it (the CLI's default, the page's)."""
    heads = {Verdict.FITS.value: "fits now", Verdict.PREEMPTS.value: "fits after preemption",
             Verdict.WAITS.value: "waits", Verdict.NEVER.value: "never fits"}
    lines = [f"verdict: {heads[a.verdict]}"]
    for o in a.outcomes:
        what = "gang" if o.gang else "pod"
        lines.append(f"{what} {o.unit} ({o.members} pod(s)): {heads[o.verdict]}"
                     + (f", within one {_level(o.placedWithin)}" if o.placedWithin else ""))
        for p in o.placed:
            topo = ", ".join(f"{k} {v}" for k, v in p.topology.items())
            pin = ("pinned at creation" if p.pinnedAtCreation
                   else "gated at creation, then placed there" if o.gang
                   else "kube-scheduler's choice among nodes that fit")
            lines.append(f"  {p.pod} -> {p.node}" + (f" ({topo})" if topo else "")
                         + f"; {pin}")
        for k in o.gated:
            lines.append(f"  {k}: gated (an extra beyond the quorum)")
        if o.victims is not None:
            v = o.victims
            who = [f"gang {g}" for g in v.gangs] + [f"pod {p}" for p in v.pods]
            lines.append(f"  evicts {', '.join(who)} ({v.evicted} pod(s)), freeing "
                         f"{v.gpusFreed} GPU(s)")
        if o.reason:
            lines.append(f"  {'note' if o.verdict == Verdict.FITS.value else 'why'}: "
                         f"{o.reason}")
        for h in o.hints:
            lines.append(f"  would fit with: {h}")
        if o.earliest is not None:
            lines.append(f"  earliest: in {o.earliest.inSeconds:g} s, when "
                         f"{o.earliest.event}")
    lines += [f"note: {n}" for n in a.notes]
    return "\n".join(lines)
