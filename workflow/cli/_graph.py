"""``workflow graph``: a workflow's steps and the events between them, as Mermaid or a page.

The graph comes from the class's step signatures; the workflow is never instantiated, so
drawing it opens no store and runs nothing.
"""

from __future__ import annotations

import html
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import click

from eventstore import class_name

from .._events import HumanResponseEvent, InputRequiredEvent, StartEvent, StopEvent
from .._graph import Graph
from .._journal import StepShape
from .._step import collect_steps
from .._workflow import Workflow
from ._app import cli
from ._common import emit_json, import_object

__all__ = ["Flow", "flow_of", "graph", "mermaid", "render_graph_page"]

START: Final = "_start"
STOP: Final = "_stop"
HUMAN: Final = "_human"


@dataclass
class Flow:
    """Nodes (steps and the run's ends) and labelled edges between them."""

    name: str
    steps: list[str]
    edges: list[tuple[str, str, str]] = field(default_factory=list)  # (from, to, event class)
    described: dict[str, StepShape] = field(default_factory=dict)

    def nodes(self) -> list[str]:
        """Every node: the start, the steps, the human (if any), the stop."""
        ends = {source for source, _, _ in self.edges} | {target for _, target, _ in self.edges}
        extra = [HUMAN] if HUMAN in ends else []
        return [START, *self.steps, *extra, STOP]


def _short(event_type: type) -> str:
    return event_type.__qualname__


def flow_of(cls: type[Workflow]) -> Flow:
    """The step graph of a workflow class: who emits which event to whom."""
    graph = Graph(collect_steps(cls))
    flow = Flow(class_name(cls), list(graph.steps), described=graph.describe())
    seen: set[tuple[str, str, str]] = set()

    def edge(source: str, target: str, label: str) -> None:
        if (source, target, label) not in seen:
            seen.add((source, target, label))
            flow.edges.append((source, target, label))

    for name, spec in graph.steps.items():
        for event_type in spec.accepted:
            if issubclass(event_type, StartEvent) or issubclass(StartEvent, event_type):
                edge(
                    START,
                    name,
                    _short(event_type) if issubclass(event_type, StartEvent) else "StartEvent",
                )
            elif issubclass(event_type, HumanResponseEvent):
                edge(HUMAN, name, _short(event_type))
        for event_type in spec.returns:
            if issubclass(event_type, StopEvent):
                edge(name, STOP, _short(event_type))
                continue
            targets = graph.route(event_type)
            if not targets and issubclass(event_type, InputRequiredEvent):
                edge(name, HUMAN, _short(event_type))
            for target in targets:
                edge(name, target, _short(event_type))
    return flow


def _node_id(node: str) -> str:
    # Mermaid reads some words (`end`, `graph`) as keywords: every id gets a prefix.
    return f"wf{node}" if node.startswith("_") else f"step_{node}"


def _label(node: str) -> str:
    return {START: "run()", STOP: "result", HUMAN: "human (send)"}.get(node, node)


def mermaid(flow: Flow) -> str:
    """The graph as Mermaid flowchart text."""
    lines = ["flowchart TD"]
    for n in flow.nodes():
        text = _label(n).replace('"', "'")
        shape = f'(["{text}"])' if n.startswith("_") else f'["{text}"]'
        lines.append(f"    {_node_id(n)}{shape}")
    for a, b, label in flow.edges:
        lines.append(f"    {_node_id(a)} -->|{label}| {_node_id(b)}")
    return "\n".join(lines) + "\n"


def _ranks(flow: Flow) -> dict[str, int]:
    rank = {START: 0}
    todo = deque([START])
    out: dict[str, list[str]] = {}
    for a, b, _ in flow.edges:
        out.setdefault(a, []).append(b)
    while todo:
        n = todo.popleft()
        for m in out.get(n, []):
            if m not in rank:
                rank[m] = rank[n] + 1
                todo.append(m)
    last = max(rank.values(), default=0)
    for n in flow.nodes():
        rank.setdefault(n, last + 1 if n == STOP else 1)
    rank[STOP] = max(rank[STOP], max((r for k, r in rank.items() if k != STOP), default=0) + 1)
    return rank


def render_graph_page(flow: Flow) -> str:
    """A self-contained page: the graph drawn as SVG (no script, no network) and its Mermaid."""
    rank = _ranks(flow)
    layers: dict[int, list[str]] = {}
    for n in flow.nodes():
        layers.setdefault(rank[n], []).append(n)
    w, h, gap_x, gap_y = 150, 36, 40, 70
    width = max(len(v) for v in layers.values()) * (w + gap_x) + gap_x
    pos: dict[str, tuple[float, float]] = {}
    for r, names in sorted(layers.items()):
        row_w = len(names) * (w + gap_x) - gap_x
        for i, n in enumerate(names):
            pos[n] = ((width - row_w) / 2 + i * (w + gap_x), 20 + r * (h + gap_y))
    height = max(y for _, y in pos.values()) + h + 30
    parts = [
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"'
        ' markerHeight="7" orient="auto"><path d="M0 0L10 5L0 10z" fill="#475467"/></marker>'
        "</defs>"
    ]
    for a, b, label in flow.edges:
        (ax, ay), (bx, by) = pos[a], pos[b]
        x1, y1, x2, y2 = ax + w / 2, ay + h, bx + w / 2, by
        if by <= ay:  # a loop back up: around the right side of the nodes
            x1, y1, x2, y2 = ax + w, ay + h / 2, bx + w, by + h / 2
            bend = max(x1, x2) + 60
            d = f"M{x1} {y1} C{bend} {y1} {bend} {y2} {x2} {y2}"
            lx, ly = bend - 10, (y1 + y2) / 2
        else:
            mid = (y1 + y2) / 2
            d = f"M{x1} {y1} C{x1} {mid} {x2} {mid} {x2} {y2}"
            lx, ly = (x1 + x2) / 2, mid
        parts.append(
            f'<path class="edge" d="{d}" fill="none" stroke="#475467" marker-end="url(#arrow)"/>'
            f'<text x="{lx}" y="{ly - 3}" text-anchor="middle" class="elabel">'
            f"{html.escape(label)}</text>"
        )
    for n, (x, y) in pos.items():
        cls = "end" if n.startswith("_") else "step"
        rx = h / 2 if cls == "end" else 6
        parts.append(
            f'<g class="node {cls}" data-node="{html.escape(n)}"><rect x="{x}" y="{y}" width="{w}"'
            f' height="{h}" rx="{rx}"/><text x="{x + w / 2}" y="{y + h / 2 + 5}"'
            f' text-anchor="middle">{html.escape(_label(n))}</text></g>'
        )
    svg = f'<svg width="{width + 80}" height="{height}">' + "".join(parts) + "</svg>"
    title = html.escape(flow.name)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} — steps</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #1d2330; }}
.node rect {{ fill: #eff4ff; stroke: #2e90fa; }}
.node.end rect {{ fill: #f2f4f7; stroke: #667085; }}
.node text {{ font-size: 13px; }} .elabel {{ font-size: 11px; fill: #344054; }}
pre {{ background: #f6f7f9; padding: 8px; }}
</style></head>
<body><h1>{title}</h1>
{svg}
<h2>Mermaid</h2><pre id="mermaid">{html.escape(mermaid(flow))}</pre>
</body></html>
"""


@cli.command()
@click.option(
    "--workflow", "workflow_spec", required=True, metavar="MODULE:CLASS", help="The workflow."
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write FILE.mmd (Mermaid) or FILE.html."
)
@click.option("--json", "as_json", is_flag=True, help="Print the steps and their events as JSON.")
def graph(workflow_spec: str, output: str | None, as_json: bool) -> None:
    """Draw a workflow's steps and the events between them (Mermaid text, or an HTML page)."""
    cls = import_object(workflow_spec, "--workflow")
    if not (isinstance(cls, type) and issubclass(cls, Workflow)):
        msg = f"{workflow_spec} is not a Workflow subclass"
        raise click.BadParameter(msg, param_hint="--workflow")
    flow = flow_of(cls)
    if as_json:
        emit_json({"workflow": flow.name, "steps": flow.described, "edges": flow.edges})
        return
    if output is None:
        click.echo(mermaid(flow), nl=False)
        return
    path = Path(output)
    text = render_graph_page(flow) if path.suffix.lower() in (".html", ".htm") else mermaid(flow)
    path.write_text(text, encoding="utf-8")
    click.echo(f"wrote {path}")
