"""Plain-text listing of ``report.fusions``: the fusions applied and the candidates declined,
each with its rule, the nodes it covered and why (``fusegraph inspect --fusions``)."""
from __future__ import annotations

from collections import Counter


def fusion_text(fusions) -> str:
    applied = [f for f in fusions if f.applied]
    declined = [f for f in fusions if not f.applied]
    lines = []
    for title, group in (("applied", applied), ("declined", declined)):
        by_rule = Counter(f.rule for f in group)
        summary = ", ".join(f"{rule} {n}" for rule, n in sorted(by_rule.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"fusions {title}: {len(group)}" + (f" ({summary})" if summary else ""))
        width = max((len(f.rule) for f in group), default=0)
        for f in group:
            what = ", ".join(f.nodes)
            why = f" {f.reason}" if f.applied and f.reason else (f": {f.reason}" if f.reason else "")
            lines.append(f"  {f.rule:<{width}}  {what}{why}")
    return "\n".join(lines)
