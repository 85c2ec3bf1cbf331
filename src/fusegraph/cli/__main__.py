"""``python -m fusegraph.cli``: the ``fusegraph`` command."""
import sys

from .main import main

sys.exit(main())
