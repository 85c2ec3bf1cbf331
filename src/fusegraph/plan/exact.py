"""Exact offset assignment for small problems, with a time limit.

Offsets are counted in alignment units, so the model is a strip packing with fixed x (time
spans) and free y (offset): OR-Tools CP-SAT's ``NoOverlap2D`` when ``ortools`` is installed
(built as a text-format model through its C++ wrappers: its ``cp_model`` module imports
pandas, private memory held for the rest of the process), else a big-M MILP through
``scipy.optimize.milp`` (HiGHS) for the smallest cases. Both are optional: with neither,
``solve_exact`` returns None and the heuristics' result stands.
A heuristic solution seeds the search (hint / upper bound), so the result is never worse.
"""
from __future__ import annotations

MILP_MAX_PAIRS = 400


def _units(size: int, unit: int) -> int:
    return -(-size // unit)


def solve_exact(buffers, constraints, adj, hint=None):
    """``(offsets, proven_optimal)`` or None (no solver, or nothing found within the time limit)."""
    live = [i for i, b in enumerate(buffers) if b.size > 0]
    if not live:
        return {b.name: 0 for b in buffers}, True
    try:
        return _cpsat(buffers, constraints, adj, live, hint)
    except ImportError:
        pass
    try:
        return _milp(buffers, constraints, adj, live, hint)
    except ImportError:
        return None


def _bounds(buffers, constraints, live, hint):
    unit = max(1, constraints.alignment)
    sizes = {i: _units(buffers[i].size, unit) for i in live}
    if hint is not None:
        upper = max(hint[buffers[i].name] // unit + sizes[i] for i in live)
    else:
        upper = sum(sizes.values())
    horizon = max(b.last for b in buffers) + 1
    per_step = [0] * (horizon + 1)
    for i in live:
        b = buffers[i]
        spans = ((0, horizon - 1),) if b.name in constraints.exclusive else b.spans
        for s, e in spans:
            for t in range(s, e + 1):
                per_step[t] += sizes[i]
    return unit, sizes, upper, max(per_step), horizon


def _cpsat(buffers, constraints, adj, live, hint):
    try:
        from ortools.sat.python import cp_model_helper as cmh
        cmh.CpModelProto, cmh.SolveWrapper, cmh.SatParameters   # noqa: B018 - ortools >= 9.12's wrappers
    except (ImportError, AttributeError):
        return _cpsat_model(buffers, constraints, live, hint)
    unit, sizes, upper, lower, horizon = _bounds(buffers, constraints, live, hint)
    model = cmh.CpModelProto()
    if not model.parse_text_format(_cpsat_text(buffers, constraints, live, hint, unit, sizes, upper, lower, horizon)):
        return None
    params = cmh.SatParameters()
    params.max_time_in_seconds = float(constraints.exact_time_limit_s)
    params.num_workers = 1
    params.random_seed = 0
    solver = cmh.SolveWrapper()
    solver.set_parameters(params)
    response = solver.solve(model)
    if response.status not in (cmh.CpSolverStatus.OPTIMAL, cmh.CpSolverStatus.FEASIBLE):
        return None
    values = list(response.solution)
    offsets = {b.name: 0 for b in buffers}
    for k, i in enumerate(live):
        offsets[buffers[i].name] = int(values[1 + k]) * unit
    return offsets, response.status == cmh.CpSolverStatus.OPTIMAL


def _cpsat_text(buffers, constraints, live, hint, unit, sizes, upper, lower, horizon) -> str:
    """The strip packing as a ``CpModelProto`` in protobuf text format, made of integers only:
    variable 0 is the arena top, 1 + k the offset of ``live[k]``; one offset interval per buffer,
    one fixed time interval per span of it, ``NoOverlap2D`` over the pairs, ``y + size <= top``,
    minimise ``top``."""
    lines = [f"variables {{ domain: [{lower}, {upper}] }}"]
    lines += [f"variables {{ domain: [0, {max(0, upper - sizes[i])}] }}" for i in live]
    xs, y_boxes = [], []
    for k, i in enumerate(live):
        v, size = 1 + k, sizes[i]
        lines.append(f"constraints {{ interval {{ start {{ vars: {v} coeffs: 1 }} "
                     f"end {{ vars: {v} coeffs: 1 offset: {size} }} size {{ offset: {size} }} }} }}")
    for k, i in enumerate(live):
        b = buffers[i]
        spans = ((0, horizon - 1),) if b.name in constraints.exclusive else b.spans
        for s, e in spans:
            xs.append(len(live) + len(xs))
            y_boxes.append(k)
            lines.append(f"constraints {{ interval {{ start {{ offset: {s} }} end {{ offset: {e + 1} }} "
                         f"size {{ offset: {e - s + 1} }} }} }}")
    lines.append(f"constraints {{ no_overlap_2d {{ x_intervals: {xs} y_intervals: {y_boxes} }} }}")
    for k, i in enumerate(live):
        lines.append(f"constraints {{ linear {{ vars: [{1 + k}, 0] coeffs: [1, -1] "
                     f"domain: [{-(1 << 62)}, {-sizes[i]}] }} }}")
    lines.append("objective { vars: [0] coeffs: [1] }")
    if hint is not None:
        hv = [1 + k for k in range(len(live))]
        lines.append(f"solution_hint {{ vars: {hv} values: {[hint[buffers[i].name] // unit for i in live]} }}")
    return "\n".join(lines)


def _cpsat_model(buffers, constraints, live, hint):
    """The same model through ``cp_model`` (ortools before 9.12; it imports pandas)."""
    from ortools.sat.python import cp_model

    unit, sizes, upper, lower, horizon = _bounds(buffers, constraints, live, hint)
    m = cp_model.CpModel()
    top = m.NewIntVar(lower, upper, "top")
    ys, xs_boxes, ys_boxes = {}, [], []
    for i in live:
        b = buffers[i]
        y = m.NewIntVar(0, max(0, upper - sizes[i]), f"y{i}")
        ys[i] = y
        yi = m.NewFixedSizeIntervalVar(y, sizes[i], f"yi{i}")
        spans = ((0, horizon - 1),) if b.name in constraints.exclusive else b.spans
        for k, (s, e) in enumerate(spans):
            xs_boxes.append(m.NewFixedSizeIntervalVar(s, e - s + 1, f"x{i}_{k}"))
            ys_boxes.append(yi)
        m.Add(y + sizes[i] <= top)
        if hint is not None:
            m.AddHint(y, hint[b.name] // unit)
    m.AddNoOverlap2D(xs_boxes, ys_boxes)
    m.Minimize(top)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(constraints.exact_time_limit_s)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    offsets = {b.name: 0 for b in buffers}
    for i in live:
        offsets[buffers[i].name] = int(solver.Value(ys[i])) * unit
    return offsets, status == cp_model.OPTIMAL


def _milp(buffers, constraints, adj, live, hint):
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    unit, sizes, upper, lower, _ = _bounds(buffers, constraints, live, hint)
    pairs = [(i, j) for i in live for j in adj[i] if i < j and buffers[j].size > 0]
    if len(pairs) > MILP_MAX_PAIRS:
        return None
    col = {i: k for k, i in enumerate(live)}
    n_y, n = len(live), len(live) + 1 + len(pairs)
    top = n_y
    rows, lo, hi = [], [], []
    for i in live:  # y_i + s_i <= top
        r = np.zeros(n)
        r[col[i]], r[top] = 1, -1
        rows.append(r), lo.append(-np.inf), hi.append(-sizes[i])
    big = upper
    for k, (i, j) in enumerate(pairs):  # z=1: i below j ; z=0: j below i
        z = n_y + 1 + k
        r = np.zeros(n)
        r[col[i]], r[col[j]], r[z] = 1, -1, big
        rows.append(r), lo.append(-np.inf), hi.append(big - sizes[i])
        r = np.zeros(n)
        r[col[j]], r[col[i]], r[z] = 1, -1, -big
        rows.append(r), lo.append(-np.inf), hi.append(-sizes[j])
    c = np.zeros(n)
    c[top] = 1
    lb = np.zeros(n)
    ub = np.ones(n)
    for i in live:
        ub[col[i]] = max(0, upper - sizes[i])
    lb[top], ub[top] = lower, upper
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=np.ones(n),
               bounds=Bounds(lb, ub), options={"time_limit": float(constraints.exact_time_limit_s)})
    if res.x is None:
        return None
    offsets = {b.name: 0 for b in buffers}
    for i in live:
        offsets[buffers[i].name] = int(round(res.x[col[i]])) * unit
    return offsets, res.status == 0
