"""Megatron sequence parallelism (Korthikanti et al. 2022, §4.2.2): collectives, sharded nodes, memory."""

from __future__ import annotations

from typing import Any

import pytest

import fxcost
from fxcost import zoo
from fxcost.estimator import Captured, default_estimator
from fxcost.gpus import get_device
from fxcost.lowering.nodes import gemm_node
from fxcost.records import NodeCost
from fxcost.sim import Cluster, SimResult, Strategy, collective_ms, simulate
from fxcost.sim.plan import Plan, compile_plan
from fxcost.sim.shard import shard_column, shard_node, shard_sequence
from fxcost.sim.simulator import OPTIMIZER_STEP

LAYERS, DIM, SEQ, VOCAB, BATCH = 2, 64, 16, 256, 8
TOKENS = BATCH * SEQ
FP32 = 4


@pytest.fixture(scope="module")
def gpt() -> tuple[Any, Captured]:
    model, inputs = zoo.build("gpt2", BATCH, seq=SEQ, dim=DIM, heads=4, layers=LAYERS, vocab=VOCAB)
    return model, default_estimator().capture(model, inputs, batch_size=BATCH)


def _plan(gpt: tuple[Any, Captured], spec: str) -> Plan:
    model, captured = gpt
    params = fxcost.sim.simulator._params_by_module(model)
    return compile_plan(captured, params, Strategy.parse(spec), get_device("A100-SXM4-80GB"), BATCH)


def test_the_strategy_takes_sp_with_tensor_parallelism_only() -> None:
    s = Strategy.parse("tp=2,sp=1")
    assert s.sp and str(s) == "dp=1,tp=2,pp=1,mb=1,sp=1" and Strategy.parse(str(s)) == s
    assert Strategy.from_dict({"tp": 4, "sp": True}).sp and not Strategy.parse("tp=2,sp=0").sp
    with pytest.raises(ValueError, match=r"sp\) needs tensor parallelism: tp > 1, got tp=1"):
        Strategy(sp=True)
    with pytest.raises(ValueError, match="sp must be true or false"):
        Strategy.parse("tp=2,sp=maybe")
    with pytest.raises(ValueError, match="sp with a module at tp=1 is not supported"):
        Strategy(tp=2, sp=True, modules={"blocks.0": {"tp": 1}})


def test_each_all_reduce_becomes_an_all_gather_before_the_block_and_a_reduce_scatter_after(
    gpt: tuple[Any, Captured],
) -> None:
    # A layer's activations (and their gradients) are TOKENS x DIM fp32 values; NCCL's convention
    # prices an all-gather on its gathered output and a reduce-scatter on its input: the same bytes.
    whole = TOKENS * DIM * FP32
    plain, sp = _plan(gpt, "tp=2"), _plan(gpt, "tp=2,sp=1")
    for a, b in (
        (plain.stages[0].forward, sp.stages[0].forward),
        (plain.stages[0].backward, sp.stages[0].backward),
    ):
        for seg_a, seg_b in zip(a, b, strict=True):
            kinds_a = [(c.kind, c.group, c.nbytes) for c in seg_a.inside]
            kinds_b = [(c.kind, c.group, c.nbytes) for c in seg_b.inside]
            if seg_a.layer:
                assert kinds_a == [("all_reduce", "tp", whole)] * 2
                assert kinds_b == [("all_gather", "tp", whole), ("reduce_scatter", "tp", whole)] * 2
            else:  # the vocabulary-parallel head and embedding keep their all-reduce
                assert kinds_b == kinds_a
    # Stages send, and recomputed layers keep, a rank's part of the sequence.
    assert (plain.boundary_bytes, sp.boundary_bytes) == (whole, whole / 2)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_a_llama_layer_gathers_once_per_block_though_its_projections_are_square(kv_heads: int) -> None:
    # q_proj (and k_proj and v_proj with as many key/value heads as heads) map the width to the width,
    # as the output projection does; but every product of a block before its last is column-parallel
    # (its output split by heads), not a row-parallel output scattered at once.
    from fxcost.zoo.hf import hf_step

    ffn = 96  # not TOKENS (128): the MLP's products are told from the tokens by their width
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": LAYERS,
              "hidden_size": DIM, "num_attention_heads": 4, "num_key_value_heads": kv_heads,
              "intermediate_size": ffn, "vocab_size": VOCAB, "max_position_embeddings": SEQ,
              "attn_implementation": "sdpa"}  # fmt: skip
    step = hf_step(config, BATCH, SEQ)
    captured = default_estimator().capture(
        step.model, step.inputs, True, loss_fn=step.loss_fn, batch_size=BATCH
    )
    llama = (step.model, captured)
    whole = TOKENS * DIM * FP32
    for spec, per_block in (("tp=2", [("all_reduce", whole)]),
                            ("tp=2,sp=1", [("all_gather", whole), ("reduce_scatter", whole)])):  # fmt: skip
        layers = [seg for seg in _plan(llama, spec).stages[0].forward if seg.layer]
        assert len(layers) == LAYERS
        assert all([(c.kind, c.nbytes) for c in seg.inside] == per_block * 2 for seg in layers)

    def product(name: str) -> NodeCost:
        return next(n for n in captured.report.nodes if n.module.endswith(name) and n.op == "aten.mm.default"
                    and n.phase == "fw")  # fmt: skip

    width = kv_heads * DIM // 4
    for name, features in (("q_proj", DIM), ("k_proj", width), ("v_proj", width), ("up_proj", ffn)):
        column = shard_column(product(name), 2, TOKENS)
        assert column is not None and column.out_shapes == [(TOKENS, features // 2)], name
    row = shard_node(product("o_proj"), 2, DIM, TOKENS)  # the last product: along the contraction
    assert row is not None and row.in_shapes[-1] == (DIM // 2, DIM) and row.out_shapes == [(TOKENS, DIM)]


def test_a_projection_as_wide_as_the_micro_batch_still_splits() -> None:
    # 64 tokens through a 64-wide square projection: the tokens are the rows, the features still split.
    node = gemm_node("linear", 1, 64, 64, 64)
    row, column = shard_node(node, 2, DIM, 64), shard_column(node, 2, 64)
    assert row is not None and row.in_shapes == [(64, 32), (32, 64)]
    assert column is not None and column.in_shapes == [(64, 64), (64, 32)]


def _split_cost_ms(sp: SimResult, cluster: Cluster) -> float:
    """What sequence parallelism adds to the tensor-parallel communication of one iteration: each
    all-gather and reduce-scatter pair in place of an all-reduce of the same buffer."""
    ranks = range(cluster.world_size)
    return sum(
        count * (collective_ms("all_gather", nbytes, ranks, cluster)
                 + collective_ms("reduce_scatter", nbytes, ranks, cluster)
                 - collective_ms("all_reduce", nbytes, ranks, cluster))
        for (kind, _, nbytes), count in sp.collectives.items() if kind == "all_gather"
    )  # fmt: skip


def test_within_a_node_the_gather_and_scatter_cost_what_the_all_reduce_did(gpt: tuple[Any, Captured]) -> None:
    model, captured = gpt
    params = fxcost.sim.simulator._params_by_module(model)
    runs = [simulate(captured, spec, "2xA100-SXM4-80GB", params=params, batch=BATCH)
            for spec in ("tp=2", "tp=2,sp=1")]  # fmt: skip
    plain, sp = runs
    whole = TOKENS * DIM * FP32
    per_layer = 2 * 2  # two blocks, forward and backward
    assert sp.collectives[("all_gather", "tp", whole)] == LAYERS * per_layer
    assert sp.collectives[("reduce_scatter", "tp", whole)] == LAYERS * per_layer
    assert sp.collectives[("all_reduce", "tp", whole)] == plain.collectives[("all_reduce", "tp", whole)] - (
        LAYERS * per_layer
    )
    # Each all-reduce became a reduce-scatter and an all-gather: the same bytes, one more launch.
    comm = [sum(t.duration_ms for t in r.tasks if t.stream == "feature") for r in runs]
    assert comm[1] == pytest.approx(
        comm[0] + _split_cost_ms(sp, Cluster.parse("2xA100-SXM4-80GB")), rel=1e-12
    )


def test_norms_dropouts_and_residual_adds_run_on_a_part_of_the_sequence(gpt: tuple[Any, Captured]) -> None:
    _, captured = gpt
    by_op = {(n.op, n.phase): n for n in captured.report.nodes if n.module.startswith("blocks.0")}
    norm = shard_sequence(by_op[("aten.native_layer_norm.default", "fw")], 2, DIM, TOKENS)
    assert norm is not None
    assert norm.in_shapes == [(BATCH, SEQ // 2, DIM), (DIM,), (DIM,)]  # the weights stay whole
    assert norm.out_shapes == [(BATCH, SEQ // 2, DIM), (BATCH, SEQ // 2, 1), (BATCH, SEQ // 2, 1)]
    assert norm.bytes_written == (TOKENS // 2) * (DIM + 2) * FP32
    drop = shard_sequence(by_op[("aten.native_dropout.default", "fw")], 4, DIM, TOKENS)
    assert drop is not None and drop.out_shapes == [(BATCH, SEQ // 4, DIM)] * 2
    add = shard_sequence(by_op[("aten.add.Tensor", "fw")], 2, DIM, TOKENS)
    whole_add = by_op[("aten.add.Tensor", "fw")]
    assert add is not None and whole_add.flops is not None and add.flops == whole_add.flops // 2
    # Matmuls belong to the tensor-parallel blocks; attention scores span no sequence of the width.
    assert shard_sequence(by_op[("aten.addmm.default", "fw")], 2, DIM, TOKENS) is None
    assert shard_sequence(by_op[("aten._softmax.default", "fw")], 2, DIM, TOKENS) is None


def test_the_activations_outside_the_blocks_are_kept_split(gpt: tuple[Any, Captured]) -> None:
    plain, sp = _plan(gpt, "tp=2"), _plan(gpt, "tp=2,sp=1")
    # Per layer, outside the blocks: two layer norms (output and two fp32 statistics per token), two
    # dropouts (output and a bool mask) and two residual adds, all TOKENS x DIM; sp keeps half of each.
    norm, dropout, add = TOKENS * (DIM + 2) * FP32, TOKENS * DIM * (FP32 + 1), TOKENS * DIM * FP32
    outside = 2 * (norm + dropout + add)
    for seg_a, seg_b in zip(plain.stages[0].forward, sp.stages[0].forward, strict=True):
        assert seg_a.saved_bytes - seg_b.saved_bytes == (outside / 2 if seg_a.layer else 0)
    assert plain.stages[0].activation_bytes - sp.stages[0].activation_bytes == LAYERS * outside / 2
    # Recomputed layers keep only their input: a rank's part of it.
    recomputed = _plan(gpt, "tp=2,sp=1,recompute=1")
    outer = sum(seg.saved_bytes for seg in recomputed.stages[0].forward if not seg.layer)
    assert recomputed.stages[0].activation_bytes == outer + LAYERS * TOKENS * DIM * FP32 / 2


@pytest.mark.slow
def test_a_tp_heavy_plan_computes_less_and_communicates_as_much_with_sp() -> None:
    # Wide enough for the split norms and dropouts to be bandwidth-bound, not launch-bound.
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 1024,
              "n_head": 16, "vocab_size": 1024, "n_positions": 1024}  # fmt: skip
    runs = [
        simulate(config, spec, "4xA100-SXM4-80GB", batch=8, seqlen=1024) for spec in ("tp=4", "tp=4,sp=1")
    ]
    plain, sp = ({t.name: t.duration_ms for t in r.tasks if t.stream == "compute"} for r in runs)
    layers = [name for name in plain if "outer" not in name and name != OPTIMIZER_STEP]
    assert len(layers) == 4 and all(sp[name] < plain[name] for name in layers)
    assert [plain[name] for name in plain if name not in layers] == [
        sp[name] for name in sp if name not in layers
    ]
    comm = [sum(t.duration_ms for t in r.tasks if t.stream == "feature") for r in runs]
    assert comm[1] == pytest.approx(
        comm[0] + _split_cost_ms(runs[1], Cluster.parse("4xA100-SXM4-80GB")), rel=1e-12
    )
    assert runs[1].iteration_ms < runs[0].iteration_ms
    assert runs[1].memory[0].activations < runs[0].memory[0].activations


def test_a_norm_inside_the_attention_is_split_with_its_block() -> None:
    # Qwen3 normalizes each head's queries and keys inside the attention (q_norm, k_norm): its tensors
    # split with the heads, its block still gathers once and scatters once; the layer's own norms
    # (input_layernorm) stay outside the tensor-parallel blocks.
    from fxcost.sim.layers import in_tp_region
    from fxcost.zoo.hf import hf_step

    config = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": LAYERS,
              "hidden_size": DIM, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": DIM // 4,
              "intermediate_size": 96, "vocab_size": VOCAB, "max_position_embeddings": SEQ,
              "attn_implementation": "sdpa"}  # fmt: skip
    step = hf_step(config, BATCH, SEQ)
    captured = default_estimator().capture(
        step.model, step.inputs, True, loss_fn=step.loss_fn, batch_size=BATCH
    )
    whole = TOKENS * DIM * FP32
    layers = [seg for seg in _plan((step.model, captured), "tp=2,sp=1").stages[0].forward if seg.layer]
    per_block = [("all_gather", whole), ("reduce_scatter", whole)]
    assert layers and all([(c.kind, c.nbytes) for c in seg.inside] == per_block * 2 for seg in layers)
    norms = [n for n in captured.report.nodes if n.module.endswith(("q_norm", "k_norm")) and n.phase == "fw"]
    assert norms and all(in_tp_region(n.module, n.module.split(".self_attn")[0]) for n in norms)
    assert not in_tp_region("model.layers.0.input_layernorm", "model.layers.0")
    for n in norms:
        if n.bytes_written and n.out_shapes and n.out_shapes[0][-1] != 1:  # the statistics keep a column
            split = shard_node(n, 2, DIM, TOKENS)
            assert split is not None and split.bytes_written == n.bytes_written // 2, n.op
