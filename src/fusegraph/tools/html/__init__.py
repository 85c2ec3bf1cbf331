"""The self-contained HTML report of a compiled model (``fusegraph inspect --html``):
``page.py`` assembles it from the parts (``parts.py``: escaping, tables, figures), the
precision section (``precision.py``), the SVG plots (``plots.py``) and the page's CSS / JS
(``assets.py``)."""
from .page import render_html, write_html

__all__ = ["render_html", "write_html"]
