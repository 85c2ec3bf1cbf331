"""The HTML report's int8 part of the precision section (``precision.py``): how the model was
quantised (``report.precision["int8"]``: static or dynamic, the calibration method and inputs,
products in int8) with every quantised activation's calibrated range, scale and zero point,
and, for ``precision="auto"``, what its search chose (int8 / bf16 / fp32), the errors it
measured and the products it kept float32 for the budget or why it did not choose int8."""
from __future__ import annotations

from typing import Any

from .parts import escape, html_figure, html_table


def _num(v: Any, fmt: str = ".3g") -> str:
    return "—" if v is None else format(v, fmt)


def int8_part(prec: dict) -> str:
    """'' when the model has no int8 quantisation and no auto search."""
    parts = []
    int8 = prec.get("int8")
    if int8:
        how = (f"static: calibrated ({int8.get('calibration')}) on {int8.get('calibration_inputs')} input(s)"
               + (f", percentile {int8['percentile']}" if int8.get("percentile") is not None else "")
               if int8.get("mode") == "static" else "dynamic: activation scales computed at run time")
        parts.append('<div id="precision-int8"><h3>int8 quantisation</h3><div class="figs">'
                     + html_figure("products in int8", str(int8.get("products_int8", 0)), "int8_products",
                                   int8.get("products_int8", 0))
                     + html_figure("activations quantised", str(len(int8.get("activations") or [])),
                                   "int8_activations", len(int8.get("activations") or []))
                     + f"</div><p>{escape(how)}</p>")
        acts = int8.get("activations") or []
        if acts:
            rows = [[a["tensor"], _num(a.get("lo")), _num(a.get("hi")), _num(a.get("min")), _num(a.get("max")),
                     _num(a.get("scale")), a.get("zero_point"), a.get("same_as") or ""] for a in acts]
            parts.append(f'<details class="group"><summary>quantised activations ({len(acts)}): calibrated range, '
                         f"scale, zero point</summary>"
                         + html_table(["tensor", "range lo", "range hi", "min seen", "max seen", "scale",
                                       "zero point", "parameters of"], rows, {1, 2, 3, 4, 5, 6}) + "</details>")
        parts.append("</div>")
    auto = prec.get("auto")
    if auto and auto.get("chosen"):
        search = auto.get("int8") or {}
        parts.append(f'<div id="precision-auto"><h3>precision="auto": chose {escape(auto["chosen"])}</h3>'
                     f"<p>budget {escape(_num(auto.get('budget')))} (largest relative L2 error of any output on "
                     f"{escape(auto.get('calibration_inputs'))} calibration input(s)); error of the model built "
                     f"{escape(_num(auto.get('error')))}</p>")
        if search.get("why"):
            parts.append(f"<p>int8 not chosen: {escape(search['why'])}</p>")
        if "steps" in search:
            parts.append(f"<p>int8 search: every product int8 {escape(_num(search.get('int8_error')))}; "
                         f"{escape(search.get('products'))} product(s); "
                         f"{escape(format(search.get('int8_time_share', 0.0), '.0%'))} of their estimated time "
                         f"left in int8</p>"
                         + html_table(["products kept fp32", "error"],
                                      [[s["kept"], _num(s["error"])] for s in search["steps"]], {0, 1}))
            kept = search.get("kept_fp32") or []
            if kept:
                parts.append(html_table(["product kept fp32", "error with only it int8", "estimated us", "why"],
                                        [[k["node"], _num(k.get("sensitivity")), _num(k.get("time_us")), k["why"]]
                                         for k in kept], {1, 2}))
        parts.append("</div>")
    return "".join(parts)
