"""The BERT / GPT-2 exports (tests/conftest.py's ``transformer_models``) with static input
shapes (batch 1, sequence 16; the planner plans static shapes, and with a dynamic batch or
sequence the activations are listed as unplannable): in the default order the arena is at most
1.02 x the lower bound, no two simultaneously live tensors overlap, tight never raises the
lower bound nor goes below the order floor, and outputs are identical with memory off,
balanced and tight, and match onnxruntime (ORT_DISABLE_ALL). Also at 4 layers and sequence
128 (issue 18's figure; 4-layer GPT-2 needed more simplify iterations than the old cap)."""
import numpy as np
import pytest

import fusegraph as fg
from fusegraph.plan import plan_memory
from fusegraph.plan.memory import check_assignment
from model_builders import build_transformer_models, static_shapes, transformer_feeds
from oracle import assert_outputs_close, ort_run

pytestmark = pytest.mark.slow
MB = 1e6


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformer_arena_within_2_percent_of_the_lower_bound(transformer_models, name):
    proto = static_shapes(transformer_models[name])
    models = {mode: fg.compile(proto, fg.Config(memory=mode)) for mode in ("off", "balanced", "tight")}
    bal, tight = models["balanced"].report.memory, models["tight"].report.memory
    assert not bal.unplannable, bal.unplannable
    assert bal.order == "default"
    assert bal.lower_bound_bytes <= bal.arena_bytes <= 1.02 * bal.lower_bound_bytes, bal.summary()
    assert bal.order_floor_bytes <= tight.lower_bound_bytes <= bal.lower_bound_bytes
    for mode in ("balanced", "tight"):
        mp = plan_memory(models[mode].graph, fg.Config(memory=mode))
        check_assignment(mp.lifetimes.buffers, mp.assignment.offsets, mp.constraints)
    print(f"\n{name}: arena {bal.arena_bytes / MB:.3f} MB, lower bound {bal.lower_bound_bytes / MB:.3f} MB "
          f"(x{bal.ratio_to_lower_bound:.3f}), naive {bal.naive_bytes / MB:.3f} MB, order floor "
          f"{bal.order_floor_bytes / MB:.3f} MB; tight ({tight.order}) lower bound {tight.lower_bound_bytes / MB:.3f} MB")
    feeds = transformer_feeds(seed=5, batch=1, seq=16)
    outs = {mode: m.run(feeds) for mode, m in models.items()}
    for mode in ("balanced", "tight"):
        for k, v in outs["off"].items():
            np.testing.assert_array_equal(outs[mode][k], v, err_msg=f"{name} {mode} {k}")
    assert_outputs_close(outs["balanced"], ort_run(proto, feeds))


@pytest.fixture(scope="module")
def four_layer_models(tmp_path_factory):
    return build_transformer_models(tmp_path_factory.mktemp("transformers4"), layers=4)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_four_layers_at_sequence_128(four_layer_models, name):
    proto = static_shapes(four_layer_models[name], 1, 128)
    cm = fg.compile(proto, fg.Config(threads=2))
    mem = cm.report.memory
    assert not mem.unplannable, mem.unplannable
    assert mem.lower_bound_bytes <= mem.arena_bytes <= 1.02 * mem.lower_bound_bytes, mem.summary()
    feeds = transformer_feeds(seed=6, batch=1, seq=128)
    assert_outputs_close(cm.run(feeds), ort_run(proto, feeds))
