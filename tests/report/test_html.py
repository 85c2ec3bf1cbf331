"""``fusegraph inspect --html``: the report page for resnet50 (random weights, two streams) and
the BERT export (``transformer_models``: 2 layers, hidden 768), as issue 20 asks. The page must
be self-contained (no URL, no external ``src`` / ``href``), hold every section, and show the
figures ``model.report`` has. Both pages are opened in headless Chromium when
``/usr/bin/chromium`` exists (skipped otherwise): a screenshot that is not blank, and the page's
search script run in the browser."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest

import fusegraph as fg
from fusegraph.tools.html.page import write_html
from fusegraph.testing.zoo import random_feeds, random_light_model

SECTIONS = ("summary", "graph-after", "graph-before", "fusions", "passes", "memory", "streams", "precision",
            "profile")
CHROMIUM = Path("/usr/bin/chromium")
HAVE_CHROMIUM = CHROMIUM.exists() and shutil.which(str(CHROMIUM)) is not None


@pytest.fixture(scope="module")
def resnet50(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    proto = random_light_model("resnet50")
    onnx.save(proto, tmp / "resnet50.onnx")
    model = fg.compile(str(tmp / "resnet50.onnx"), config=fg.Config(streams=2, threads=2))
    write_html(model, tmp / "resnet50.html", feeds=random_feeds(proto), source=str(tmp / "resnet50.onnx"),
               runs=2)
    yield model, (tmp / "resnet50.html").read_text()
    model.close()


@pytest.fixture(scope="module")
def bert(tmp_path_factory, transformer_models):
    import model_builders as mb
    tmp = tmp_path_factory.mktemp("html_bert")
    path = transformer_models["bert"]
    model = fg.compile(str(path), config=fg.Config(threads=2))
    feeds = mb.transformer_feeds(batch=2)
    write_html(model, tmp / "bert.html", feeds=feeds, source=str(path), runs=2)
    shown = model            # one compile for every shape: its report shows the plan of the feeds' bucket
    assert shown.memory_buckets() and all("shape-only" in u["reason"] for u in shown.report.memory.unplannable)
    yield shown, (tmp / "bert.html").read_text()
    model.close()


def _figures(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="fg-figures">(.*?)</script>', page, re.DOTALL)
    return json.loads(m.group(1))


def _shown(page: str) -> dict[str, str]:
    return dict(re.findall(r'data-fig="([^"]+)" data-value="([^"]*)"', page))


def _check(model, page: str) -> None:
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(link|img|iframe)\b", page)
    assert not re.search(r"<script[^>]*\bsrc=", page)
    for attr in re.findall(r'\b(?:src|href)="([^"]*)"', page):
        assert attr.startswith("#"), attr
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in page, sid
    r = model.report
    fig = _figures(page)
    slow = r.memory.not_writable_into_arena
    assert fig["kernel_count"] == r.kernel_count and fig["nodes_final"] == r.nodes_final
    assert fig["nodes_imported"] == r.nodes_imported and fig["pass_runs"] == len(r.passes)
    assert fig["arena_bytes"] == r.memory.arena_bytes and fig["lower_bound_bytes"] == r.memory.lower_bound_bytes
    assert fig["order_floor_bytes"] == r.memory.order_floor_bytes and fig["naive_bytes"] == r.memory.naive_bytes
    assert fig["not_writable_bytes"] == sum(d["bytes"] for d in slow) and fig["not_writable_nodes"] == len(slow)
    assert fig["fusions_applied"] == sum(f.applied for f in r.fusions)
    assert fig["fusions_declined"] == sum(not f.applied for f in r.fusions)
    assert fig["profiled_kernels"] == r.kernel_count
    shown = _shown(page)
    for key in ("kernel_count", "arena_bytes", "lower_bound_bytes", "nodes_imported", "fusions_applied"):
        assert shown[key] == str(fig[key]), key
    after = page[page.index('<section id="graph-after">'):page.index('<section id="graph-before">')]
    assert after.count('<tr class="node') == len(model.graph.nodes)
    assert after.count('<tr class="node fused"') == sum("rule" in n.meta for n in model.graph.nodes) > 0
    before = page[page.index('<section id="graph-before">'):page.index('<section id="fusions">')]
    assert before.count('<tr class="node') == r.nodes_imported
    assert 'oninput="fgSearch(this)"' in after and "<details" in before
    for p in r.passes:
        assert f"<td>{p.name}</td>" in page
    for f in [f for f in r.fusions if not f.applied][:20]:
        assert f.reason.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;") \
            .replace("'", "&#x27;") in page


def test_resnet50_page(resnet50):
    model, page = resnet50
    _check(model, page)
    assert _figures(page)["streams"] == 2 == model.plan.streams.num_streams
    assert "planner&#x27;s estimate" in page or "planner's estimate" in page
    assert page.count("<svg") >= 3   # memory timeline, Gantt, op times


def test_bert_page(bert):
    model, page = bert
    _check(model, page)
    assert "/encoder/" in page     # grouped by the exporter's name scopes


def test_cli_inspect_html(tmp_path, capsys):
    from test_knobs import knob_model

    from fusegraph.cli.main import main
    onnx.save(knob_model(), tmp_path / "m.onnx")
    assert main(["inspect", str(tmp_path / "m.onnx"), "--html", str(tmp_path / "r.html")]) == 0
    assert "report written" in capsys.readouterr().out
    assert '<section id="memory">' in (tmp_path / "r.html").read_text()
    fg.compile(str(tmp_path / "m.onnx")).save(tmp_path / "m.fgm")   # a loaded artifact's report too
    assert main(["inspect", str(tmp_path / "m.fgm"), "--html", str(tmp_path / "a.html")]) == 0
    page = (tmp_path / "a.html").read_text()
    assert _figures(page)["kernel_count"] == fg.load(tmp_path / "m.fgm").report.kernel_count
    assert all(f'<section id="{sid}">' in page for sid in SECTIONS)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(not HAVE_CHROMIUM, reason="no /usr/bin/chromium")
@pytest.mark.parametrize("which", ["resnet50", "bert"])
def test_page_in_headless_chromium(which, request, tmp_path):
    """The page renders (a 1200x900 screenshot with something drawn on it), and its inline
    search script works in the browser: a search for a kernel's name finds it (the DOM after
    the script ran says how many rows matched)."""
    from PIL import Image
    model, page = request.getfixturevalue(which)
    (tmp_path / "r.html").write_text(page)
    shot = tmp_path / "shot.png"
    _chromium("--window-size=1200,900", f"--screenshot={shot}", (tmp_path / "r.html").as_uri())
    assert shot.exists()
    image = Image.open(shot).convert("L")
    assert image.size == (1200, 900)
    lo, hi = image.getextrema()
    assert hi - lo > 100     # something was drawn: not a blank page
    assert sum(1 for c in image.histogram() if c) > 16      # text and plots, not a flat colour or two
    name = model.graph.nodes[len(model.graph.nodes) // 2].name
    want = sum(name.lower() in n.name.lower() for n in model.graph.nodes)   # rows whose name has it
    probe = ("<script>var i = document.querySelector('#graph-after input.search'); "
             f"i.value = {json.dumps(name)}; fgSearch(i);</script></body>")
    (tmp_path / "s.html").write_text(page.replace("</body>", probe))
    dom = _chromium("--dump-dom", (tmp_path / "s.html").as_uri()).stdout
    after = dom[dom.index('<section id="graph-after">'):dom.index('<section id="graph-before">')]
    hits = re.search(r'<span class="hits muted">(\d+) match\(es\)</span>', after)
    assert hits, after[:2000]
    assert int(hits.group(1)) >= want >= 1
    assert len(re.findall(r'<tr class="node[^"]*\bhit\b"', after)) == int(hits.group(1))
