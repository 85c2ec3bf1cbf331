"""The inline style sheet and script of the HTML report (no network: nothing is fetched).

The script does two things: search (a box per graph section hides the rows whose node name,
op or rule does not hold the query and opens the groups that do) and expand / collapse all
groups of a section. Everything else is static HTML: ``<details>`` groups collapse natively.
"""

CSS = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #222; }
header { background: #1f3b57; color: #fff; padding: 10px 20px; }
header h1 { margin: 0; font-size: 18px; }
nav { position: sticky; top: 0; background: #eef2f6; padding: 6px 20px; border-bottom: 1px solid #ccd;
      z-index: 2; }
nav a { margin-right: 14px; color: #1f3b57; text-decoration: none; }
main { padding: 0 20px 40px; }
section { margin-top: 18px; }
h2 { font-size: 16px; border-bottom: 1px solid #ccd; padding-bottom: 3px; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #dde; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f3f5f8; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.figs { display: flex; flex-wrap: wrap; gap: 10px 30px; }
.fig { background: #f7f9fb; border: 1px solid #dde; padding: 4px 10px; }
.fig b { display: block; font-size: 15px; }
details.group { margin: 2px 0; border-left: 3px solid #ccd; padding-left: 6px; }
details.group > summary { cursor: pointer; color: #1f3b57; }
tr.fused td { background: #fff7e6; }
tr.fused td:first-child { border-left: 3px solid #e69500; }
tr.hit td { background: #e6f4ea; }
.search { width: 320px; padding: 3px 6px; margin: 4px 8px 4px 0; }
.muted { color: #777; }
.svg svg { max-width: 100%; height: auto; }
code, .ir { font-family: ui-monospace, monospace; font-size: 12px; }
.covers { margin: 0; padding-left: 16px; }
"""

JS = """
function fgSearch(input) {
  var sec = document.getElementById(input.dataset.target);
  var q = input.value.trim().toLowerCase();
  var groups = sec.querySelectorAll('details.group');
  groups.forEach(function (g) {
    var any = false;
    g.querySelectorAll('tr.node').forEach(function (tr) {
      var ok = !q || tr.dataset.key.indexOf(q) >= 0;
      tr.style.display = ok ? '' : 'none';
      tr.classList.toggle('hit', !!q && ok);
      any = any || ok;
    });
    g.style.display = any ? '' : 'none';
    g.open = !!q && any;
  });
  var count = sec.querySelectorAll('tr.node.hit').length;
  var out = sec.querySelector('.hits');
  if (out) { out.textContent = q ? count + ' match(es)' : ''; }
}
function fgToggle(id, open) {
  document.getElementById(id).querySelectorAll('details.group').forEach(function (g) { g.open = open; });
}
"""
