"""Plain-text listing of ``report.fusions``: the fusions applied and the candidates declined,
each with its rule, the nodes it covered and why (``fusegraph inspect --fusions``); names from
the model escaped (``report/printable.py``)."""
from __future__ import annotations

from collections import Counter

from ..report.printable import printable


def fusion_text(fusions) -> str:
    applied = [f for f in fusions if f.applied]
    declined = [f for f in fusions if not f.applied]
    lines = []
    for title, group in (("applied", applied), ("declined", declined)):
        by_rule = Counter(printable(f.rule) for f in group)
        summary = ", ".join(f"{rule} {n}" for rule, n in sorted(by_rule.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"fusions {title}: {len(group)}" + (f" ({summary})" if summary else ""))
        width = max((len(printable(f.rule)) for f in group), default=0)
        for f in group:
            what = ", ".join(map(printable, f.nodes))
            reason = printable(f.reason)
            why = f" {reason}" if f.applied and reason else (f": {reason}" if reason else "")
            lines.append(f"  {printable(f.rule):<{width}}  {what}{why}")
    return "\n".join(lines)
