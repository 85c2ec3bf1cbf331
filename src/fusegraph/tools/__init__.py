"""What measures and explains a model: bench, compare, compare_precision, demo, timing,
bisect, precision_bisect, profile, the fusion listing and the HTML report (``html/``). The
library never imports this package; the command line and benchmarks do."""
