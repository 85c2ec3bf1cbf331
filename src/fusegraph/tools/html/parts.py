"""Small pieces of the HTML report (``html.py``): escaping, figures, tables, and rows in
collapsible groups (by name scope, or runs of ``GROUP_CHUNK`` nodes)."""
from __future__ import annotations

import html
from typing import Any

GROUP_CHUNK = 64


def escape(x: Any) -> str:
    return html.escape(str(x), quote=True)


def mib(n: int | None) -> str:
    return "—" if n is None else f"{n / (1 << 20):.2f} MiB"


def html_figure(label: str, value: str, key: str | None = None, raw: Any = None) -> str:
    data = f' data-fig="{escape(key)}" data-value="{escape(raw)}"' if key else ""
    return f'<div class="fig"{data}>{escape(label)}<b>{escape(value)}</b></div>'


def html_table(head: list[str], rows: list[list[Any]], num: set[int] = frozenset()) -> str:
    th = "".join(f'<th{" class=num" if i in num else ""}>{escape(h)}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in num else ""}>{escape(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def op_label(node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def scope_of(name: str) -> str | None:
    parts = [p for p in name.split("/") if p]
    return "/".join(parts[:min(3, len(parts) - 1)]) if len(parts) > 1 else None


def group_items(items: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """(title, rows) groups from (scope key, row html) in order: consecutive rows sharing a
    name scope; rows without one in runs of ``GROUP_CHUNK``."""
    groups: list[tuple[str | None, list[str]]] = []
    for key, row in items:
        if groups and groups[-1][0] == key and (key is not None or len(groups[-1][1]) < GROUP_CHUNK):
            groups[-1][1].append(row)
        else:
            groups.append((key, [row]))
    merged: list[tuple[str | None, list[str]]] = []
    for key, rows in groups:   # a scope and its sub-scopes are one group; tiny groups join the previous
        if merged:
            prev, prev_rows = merged[-1]
            related = prev is not None and key is not None and (prev.startswith(key) or key.startswith(prev)) \
                and "/" in min(prev, key, key=len)
            if related or len(rows) < 4:
                merged[-1] = ((min(prev, key, key=len) if related else prev), prev_rows + rows)
                continue
        merged.append((key, rows))
    out, start = [], 0
    for key, rows in merged:
        title = key or f"nodes {start}–{start + len(rows) - 1}"
        out.append((f"{title} ({len(rows)})", rows))
        start += len(rows)
    return out


def table_row(key: str, cells: list[str], cls: str = "") -> str:
    return (f'<tr class="node{" " + cls if cls else ""}" data-key="{escape(key.lower())}">'
            + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
