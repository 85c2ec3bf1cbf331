"""Every flag of every ``fusegraph`` subcommand changes what the command does, or is refused
with a one-line error (exit 2, no traceback); misuse the issue tracker found ends the same way.

``WALK`` has, per (subcommand, flag), the arguments to add and what must then differ from the
command without them, or ``REFUSED``. ``test_every_flag_is_walked`` reads the flags from the
parser itself, so a flag added without an entry fails here.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph.cli.main import build_parser, main
from test_knobs import knob_model

REFUSED = "refused"
SKIP_COMMANDS = {"serve"}   # a long-running server: its flags are walked in tests/serve/


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    onnx.save(knob_model(), tmp / "m.onnx")
    fg.compile(str(tmp / "m.onnx")).save(tmp / "m.fgm")
    np.save(tmp / "x.npy", np.full((1, 8, 16, 16), 3.0, np.float32))
    (tmp / "cfg.toml").write_text("streams = 2\n")
    (tmp / "a_file").write_text("not a directory")
    (tmp / "cal").mkdir()
    for i in range(2):
        np.savez(tmp / "cal" / f"{i}.npz", x=np.random.default_rng(i).standard_normal((1, 8, 16, 16)).astype(np.float32))
    return tmp


def _invoke(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _without_times(text: str) -> str:
    import re
    return re.sub(r"\d+:\d\d:\d\d|\d+(\.\d+)? ?(ms|s|/s)(?![\w(])", "#", text)


def _differs(base: str, probe: str, t=None) -> bool:
    return _without_times(base) != _without_times(probe)


def _loaded_threads(t):
    return fg.load(t / "out.fgm").config.threads == 1


# (command, flag) -> (extra argv (with {t}: the temp folder), check(base_out, probe_out, t) | REFUSED)
WALK = {
    ("run", "--level"): (["--level", "O0"], _differs),
    ("run", "--threads"): (["--threads", "1"], _differs),
    ("run", "--input"): (["--input", "x={t}/x.npy"], _differs),
    ("run", "--output"): (["-o", "{t}/outs"], lambda b, p, t: any((t / "outs").glob("*.npy"))),
    ("inspect", "--level"): (["--level", "O0"], _differs),
    ("inspect", "--threads"): (["--threads", "1"], _differs),
    ("inspect", "--code"): (["--code"], lambda b, p, t: "def run(" in p and "def run(" not in b),
    ("inspect", "--streams"): (["--streams"], lambda b, p, t: "streams:" in p),
    ("inspect", "--fusions"): (["--fusions"], _differs),
    ("inspect", "--num-streams"): (["--num-streams", "2"], lambda b, p, t: "streams: 2" in p),
    ("inspect", "--memory"): (["--memory", "off"], _differs),
    ("inspect", "--memory-plot"): (["--memory-plot", "{t}/mem.png"], lambda b, p, t: (t / "mem.png").stat().st_size),
    ("compile", "--config"): (["--config", "{t}/cfg.toml"], lambda b, p, t: "streams: 2" in p),
    ("compile", "--level"): (["--level", "O0"], _differs),
    ("compile", "--streams"): (["--streams", "2"], lambda b, p, t: "streams: 2" in p),
    ("compile", "--memory"): (["--memory", "off"], _differs),
    ("compile", "--precision"): (["--precision", "bf16"], lambda b, p, t: "precision: bf16 policy" in p),
    ("compile", "--op-precision"): (["--op-precision", "Conv=bf16"], lambda b, p, t: "op_precision Conv=bf16" in p
                                    and fg.load(t / "out.fgm").config.op_precision == (("Conv", "bf16"),)),
    ("run", "--precision"): (["--precision", "bf16"], lambda b, p, t: "bf16 precision" in p),
    ("run", "--op-precision"): (["--op-precision", "Conv=bf16"], _differs),
    ("inspect", "--precision"): (["--precision", "bf16"], lambda b, p, t: "precision: bf16 policy" in p),
    ("inspect", "--op-precision"): (["--op-precision", "Conv=bf16"], lambda b, p, t: "op_precision Conv=bf16" in p),
    ("bench", "--precision"): (["--precision", "bf16"], lambda b, p, t: "bf16 precision" in p),
    ("bench", "--op-precision"): (["--op-precision", "Conv=bf16"], lambda b, p, t: "fp32 precision" in p),
    ("compare", "--precision"): (["--precision", "bf16"], lambda b, p, t: "fp32 vs bf16" in p and "bf16 vs ref" in p),
    ("compare", "--op-precision"): (["--op-precision", "Conv=bf16"], REFUSED),   # the reduced side of --precision
    ("compare", "--inputs"): (["--inputs", "2"], REFUSED),                       # likewise
    ("compare", "--calibration"): (["--precision", "int8", "--calibration", "{t}/cal"],
                                   lambda b, p, t: "on the 2 calibration input(s) given" in p and "int8 vs ref" in p),
    ("compare", "--calibration-method"): (["--precision", "int8", "--calibration", "{t}/cal", "--calibration-method",
                                           "entropy"], lambda b, p, t: "ranges by entropy" in p),
    ("compile", "--calibration"): (["--precision", "int8", "--calibration", "{t}/cal"],
                                   lambda b, p, t: "calibrated (minmax) on 2 input(s)" in p),
    ("compile", "--calibration-method"): (["--precision", "int8", "--calibration", "{t}/cal", "--calibration-method",
                                           "entropy"], lambda b, p, t: "calibrated (entropy) on 2 input(s)" in p),
    ("compile", "--threads"): (["--threads", "1"], lambda b, p, t: _loaded_threads(t)),
    ("compile", "--disable"): (["--disable", "cse"], _differs),
    ("compile", "--example-input"): (["--example-input", "1x3"], REFUSED),   # file.py:factory models only
    ("compile", "--output"): (["-o", "{t}/other.fgm"], lambda b, p, t: (t / "other.fgm").exists()),
    ("bench", "--vs"): (["--vs", "onnxruntime"], lambda b, p, t: "onnxruntime" in p and "onnxruntime" not in b),
    ("bench", "--threads"): (["--threads", "1"], lambda b, p, t: "1 threads" in p and "1 threads" not in b),
    ("bench", "--runs"): (["--runs", "4"], lambda b, p, t: "median of 4 runs" in p),
    ("bench", "--dim"): (["--dim", "N=2"], REFUSED),   # m.onnx has no symbolic dim: test_bench.py runs one
    ("bench", "--json"): (["--json"], lambda b, p, t: json.loads(p)["runs"] == 3),
    # m.onnx is no decoder: refused here; test_dynamic_shapes.py runs --decode on one
    ("bench", "--decode"): (["--decode", "2"], REFUSED),
    ("bench", "--prompt"): (["--prompt", "4"], REFUSED),      # without --decode
    ("demo", "--threads"): (["--threads", "1"], lambda b, p, t: "1 threads" in p and "1 threads" not in b),
    ("compare", "--level"): (["--level", "O1"], lambda b, p, t: "(O1)" in p and "(O1)" not in b),
    ("compare", "--threads"): (["--threads", "1"], lambda b, p, t: "1 thread(s)" in p),
    ("compare", "--runs"): (["--runs", "3"], lambda b, p, t: "median of 3 runs" in p),
    ("inspect", "--html"): (["--html", "{t}/r.html"], lambda b, p, t: "report written" in p
                            and "<section" in (t / "r.html").read_text()),
    ("profile", "--runs"): (["--runs", "2"], lambda b, p, t: "median of 2 runs" in p),
    ("profile", "--trace"): (["--trace", "{t}/t.json"],
                             lambda b, p, t: json.loads((t / "t.json").read_text())["traceEvents"]),
    ("profile", "--streams"): (["--streams", "2"], lambda b, p, t: "2 stream(s)" in p and "2 stream(s)" not in b),
    ("profile", "--threads"): (["--threads", "1"], lambda b, p, t: "1 thread(s)" in p),
    ("profile", "--top"): (["--top", "1"], _differs),
    ("bisect", "--reference"): (["--reference", "onnxruntime"], lambda b, p, t: "reference onnxruntime" in p),
    ("bisect", "--rtol"): (["--rtol", "0.5"], lambda b, p, t: "rtol=0.5" in p),
    ("bisect", "--atol"): (["--atol", "0.5"], lambda b, p, t: "atol=0.5" in p),
    ("bisect", "--precision"): (["--precision", "bf16"], lambda b, p, t: "ranked by their bf16 sensitivity" in p),
    ("bisect", "--top"): (["--top", "3"], REFUSED),   # the rows of --precision's ranking
    ("bisect", "--calibration"): (["--precision", "int8", "--calibration", "{t}/cal"],
                                  lambda b, p, t: "2 calibration input(s) given" in p and "int8 sensitivity" in p),
}
BASE = {"run": ["run", "{t}/m.onnx"], "inspect": ["inspect", "{t}/m.onnx"],
        "compile": ["compile", "{t}/m.onnx", "-o", "{t}/out.fgm"], "bench": ["bench", "{t}/m.onnx", "--runs", "3"],
        "compare": ["compare", "{t}/m.onnx", "--runs", "2"],
        "profile": ["profile", "{t}/m.onnx", "--runs", "3"], "bisect": ["bisect", "{t}/m.onnx"],
        "demo": ["demo"]}


def _flags():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                yield name, max(action.option_strings, key=len)


def test_every_flag_is_walked():
    flags = {f for f in _flags() if f[0] not in SKIP_COMMANDS}
    assert flags == set(WALK), f"walk these flags: {sorted(flags - set(WALK))}; gone: {sorted(set(WALK) - flags)}"


def _fill(argv, t):
    return [a.format(t=t) for a in argv]


@pytest.mark.parametrize("command, flag", sorted(WALK))
def test_flag_changes_the_outcome_or_is_refused(files, capsys, command, flag):
    extra, check = WALK[(command, flag)]
    base_argv = _fill(BASE[command], files)
    if flag == "--output":   # replaces the base command's own output
        base_argv = [a for a in base_argv if a not in ("-o", str(files / "out.fgm"))]
    code, base, err = _invoke(_fill(BASE[command], files), capsys)
    assert code == 0, err
    code, probe, err = _invoke(base_argv + _fill(extra, files), capsys)
    if check == REFUSED:
        assert code == 2 and "error" in err and "Traceback" not in err, err
        return
    assert code == 0, err
    flat = " ".join   # rich wraps long lines: compare the words
    assert check(flat(base.split()), flat(probe.split()), files), f"{command} {flag} changed nothing:\n{probe}"


@pytest.mark.parametrize("argv, words", [
    (["run", "{t}/m.onnx", "-o", "{t}/a_file"], ["not a directory"]),
    (["compile", "{t}/m.onnx", "-o", "{t}/missing/dir/x.fgm"], ["missing"]),
    (["compile", "{t}/m.onnx", "-o", "{t}/" + "n" * 300 + ".fgm"], ["name too long"]),
    (["run", "{t}"], ["directory"]),
    (["run", "{t}/nothing.onnx"], ["nothing.onnx"]),
    (["bench", "{t}/m.fgm", "--vs", "onnxruntime"], [".onnx"]),
    (["run", "{t}/m.fgm", "--level", "O0"], ["--level", "already compiled"]),
    (["inspect", "{t}/m.fgm", "--memory", "off"], ["--memory", "already compiled"]),
    (["compare", "{t}/m.onnx", "--level", "O0"], ["O1 or O2"]),
])
def test_misuse_is_a_one_line_error(files, capsys, argv, words):
    code, out, err = _invoke(_fill(argv, files), capsys)
    assert code == 2 and "Traceback" not in err and err.startswith("fusegraph: error:"), err
    for w in words:
        assert w.lower() in err.lower(), err


@pytest.mark.parametrize("argv", [["run", "{t}/m.onnx", "--threads", "0"], ["run", "{t}/m.onnx", "--threads", "4096"],
                                  ["bench", "{t}/m.onnx", "--runs", "0"], ["inspect", "{t}/m.onnx", "--num-streams", "0"]])
def test_bad_numbers_are_refused_by_the_parser(files, capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(_fill(argv, files))
    assert info.value.code == 2 and "expected" in capsys.readouterr().err


def test_html_composes_with_the_other_inspect_flags(files, capsys):
    code, out, err = _invoke(["inspect", files / "m.onnx", "--html", files / "both.html", "--code", "--fusions"],
                             capsys)
    assert code == 0, err
    assert (files / "both.html").stat().st_size and "report written" in out and "def run(" in out


def test_version_is_the_package_version_and_pyproject_version(capsys):
    """``fusegraph --version`` prints ``fusegraph.__version__``, which is pyproject.toml's."""
    import tomllib
    from pathlib import Path
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"fusegraph {fg.__version__}"
    assert fg.__version__ == pyproject["project"]["version"]
