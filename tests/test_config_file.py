"""TOML config files map one-to-one onto fg.Config; bad keys and values name the key."""
from __future__ import annotations

import dataclasses

import pytest

import fusegraph as fg
from fusegraph.config_file import config_from_mapping, config_from_toml, config_to_toml, load_config
from fusegraph.errors import ConfigError

# every field but accuracy_budget (read by precision "auto" only: set alone it is refused)
FULL = fg.Config(level="O1", disabled_passes=("cse", "dce"), precision="bf16", streams="auto", aggressive_fusion=True,
                 memory="tight", device="auto", threads=2, fold_size_limit=1024, verify_each=True,
                 tensor_lifetimes=(("x", 0, 3), ("y", 1, 2)),
                 reuse_groups=(("a", "b"), ("c",)), exclusive_tensors=("e",), external_tensors=("o",),
                 op_precision=(("Conv_0", "fp16"), ("/head/MatMul", "fp32")), max_run_bytes=1 << 30,
                 max_loop_iterations=1000)


def test_every_field_has_a_key_and_round_trips():
    text = config_to_toml(FULL)
    keys = {line.split(" = ")[0] for line in text.splitlines()}
    assert keys == {f.name for f in dataclasses.fields(fg.Config)}
    assert config_from_toml(text) == FULL
    assert config_from_toml(config_to_toml(fg.Config())) == fg.Config()


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(fg.Config)])
def test_each_key_alone_sets_its_field(field):
    lines = dict(line.split(" = ", 1) for line in config_to_toml(FULL).splitlines())
    got = config_from_toml(f"{field} = {lines[field]}")
    assert getattr(got, field) == getattr(FULL, field)
    assert dataclasses.replace(got, **{field: getattr(fg.Config(), field)}) == fg.Config()


def test_file_and_public_api(tmp_path):
    path = tmp_path / "cfg.toml"
    path.write_text('# comment\nstreams = 2\nmemory = "tight"\ndisabled_passes = ["cse"]\n')
    cfg = fg.load_config(path)
    assert cfg == fg.Config(streams=2, memory="tight", disabled_passes=("cse",))
    assert load_config(str(path)) == cfg


@pytest.mark.parametrize("text", ['aggressive_fusion = "yes"', "aggressive_fusion = 1"])
def test_a_flag_takes_true_or_false_only(text):
    with pytest.raises(ConfigError, match="aggressive_fusion must be bool"):
        config_from_toml(text, where="cfg.toml")
    with pytest.raises(ConfigError, match="aggressive_fusion must be true or false"):
        fg.Config(aggressive_fusion="yes")


def test_precision_keys():
    cfg = config_from_toml('precision = "bf16"\nop_precision = { Conv_0 = "fp16", "/head/MatMul" = "fp32" }')
    assert cfg == fg.Config(precision="bf16", op_precision=(("Conv_0", "fp16"), ("/head/MatMul", "fp32")))
    assert config_from_toml('precision = "auto"\naccuracy_budget = 0.05').accuracy_budget == 0.05
    for text, words in [('precision = "int4"', "Config.precision"), ('op_precision = { Conv = "fp8" }', "'fp8'"),
                        ("accuracy_budget = 0.05", "precision='auto' only")]:
        with pytest.raises(ConfigError, match="^cfg.toml: ") as info:
            config_from_toml(text, where="cfg.toml")
        assert words in str(info.value)


def test_strings_with_quotes_and_controls_survive():
    cfg = fg.Config(disabled_passes=('a"b', "c\\d", "tab\there", "é", "\x7f"))
    assert config_from_toml(config_to_toml(cfg)) == cfg


@pytest.mark.parametrize("text, words", [
    ("stream = 2", ["'stream'", "did you mean 'streams'"]),
    ("[passes]\ndisable = ['cse']", ["'passes'"]),
    ("level = { x = 1 }", ["level", "level.x"]),
    ("streams = true", ["streams"]),
    ("streams = 0", ["streams"]),
    ("streams = 'many'", ["streams"]),
    ("threads = 0", ["threads"]),
    ("verify_each = 1", ["verify_each"]),
    ("memory = 'loose'", ["memory"]),
    ("disabled_passes = 'cse'", ["disabled_passes"]),
    ("tensor_lifetimes = [['x', 0]]", ["tensor_lifetimes[0]"]),
    ("tensor_lifetimes = [['x', 0, 'end']]", ["tensor_lifetimes[0][2]"]),
    ("op_precision = { a = 3 }", ["op_precision[0][1]"]),
    ("fold_size_limit = 1.5", ["fold_size_limit"]),
    ("level = ", ["not valid TOML"]),
])
def test_bad_files_name_the_key(text, words):
    with pytest.raises(ConfigError) as info:
        config_from_toml(text, where="cfg.toml")
    msg = str(info.value)
    assert msg.startswith("cfg.toml: ")
    for w in words:
        assert w in msg, msg


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError):
        load_config(tmp_path / "bin.toml")


def test_config_dict_round_trip_and_unknown_key():
    assert fg.Config.from_dict(FULL.to_dict()) == FULL
    assert config_from_mapping(FULL.to_dict()) == FULL
    with pytest.raises(ConfigError, match="'memroy'.*did you mean 'memory'"):
        fg.Config.from_dict({"memroy": "tight"})
    with pytest.raises(ConfigError):
        config_from_mapping(["not", "a", "table"])


def test_compile_with_a_config_file(tmp_path):
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "c.toml"
    path.write_text('level = "O0"\nmemory = "off"\n')
    model = fg.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                       config=fg.load_config(path))
    assert model.config.level == "O0" and model.config.memory == "off"
