"""Expert parallelism (MoE all-to-alls) and context parallelism (ring attention): collectives and memory
against values computed by hand for small models."""

from __future__ import annotations

from typing import Any

import pytest

import fxcost
from fxcost import zoo
from fxcost.estimator import Captured, default_estimator
from fxcost.gpus import get_device
from fxcost.sim import Strategy
from fxcost.sim.plan import Plan, compile_plan
from fxcost.sim.ranks import groups_of
from fxcost.zoo.hf import hf_step

FP32 = 4
# A Mixtral of 2 layers: width 64, 4 experts of width 128 (gate/up fused: 64 x 256, down 128 x 64), top-2.
WIDTH, FFN, EXPERTS, TOP_K, SEQ, BATCH = 64, 128, 4, 2, 32, 8
MIXTRAL = dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=WIDTH,
               intermediate_size=FFN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, vocab_size=100)  # fmt: skip
EXPERT_PARAMS = EXPERTS * (WIDTH * 2 * FFN + FFN * WIDTH)  # per layer
# Qwen2-MoE's MLP: 4 routed experts of width 32 and a shared expert of width 64 with its own 1-wide gate.
QWEN2_MOE = dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], hidden_size=WIDTH,
                 intermediate_size=FFN, moe_intermediate_size=32, shared_expert_intermediate_size=WIDTH,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=EXPERTS,
                 num_experts_per_tok=TOP_K, vocab_size=100, decoder_sparse_step=1)  # fmt: skip
# q and o 64 x 64, k and v 64 x 32 (2 of 4 heads), the router 64 x 4, two RMSNorms of 64.
DENSE_PARAMS = 2 * WIDTH * WIDTH + 2 * WIDTH * WIDTH // 2 + WIDTH * EXPERTS + 2 * WIDTH


@pytest.fixture(scope="module")
def mixtral() -> tuple[Any, Captured]:
    step = hf_step(MIXTRAL, BATCH, SEQ)
    return step.model, default_estimator().capture(step.model, step.inputs, True, loss_fn=step.loss_fn,
                                                   batch_size=BATCH)  # fmt: skip


@pytest.fixture(scope="module")
def gpt() -> tuple[Any, Captured]:
    model, inputs = zoo.build("gpt2", BATCH, seq=SEQ, dim=WIDTH, heads=4, layers=2, vocab=256)
    return model, default_estimator().capture(model, inputs, batch_size=BATCH)


def _plan(traced: tuple[Any, Captured], spec: str) -> Plan:
    model, captured = traced
    params = fxcost.sim.simulator._params_by_module(model)
    return compile_plan(captured, params, Strategy.parse(spec), get_device("A100-SXM4-80GB"), BATCH)


def _comms(plan: Plan, where: str = "inside") -> list[tuple[str, str, float]]:
    st = plan.stages[0]
    return [(c.kind, c.group, c.nbytes) for seg in st.forward + st.backward for c in getattr(seg, where)]


def test_the_strategy_takes_ep_expert_load_and_cp() -> None:
    s = Strategy.parse("dp=4,ep=2,cp=2,expert_load=0.4/0.2/0.2/0.2")
    assert (s.ep, s.cp, s.expert_load, s.world_size, s.data_ranks) == (2, 2, (0.4, 0.2, 0.2, 0.2), 8, 8)
    assert Strategy.parse(str(s)) == s and str(Strategy()) == "dp=1,tp=1,pp=1,mb=1"
    with pytest.raises(ValueError, match="ep=3 does not divide dp=4"):
        Strategy(dp=4, ep=3)
    with pytest.raises(ValueError, match="summing to 1"):
        Strategy.parse("dp=2,ep=2,expert_load=0.5/0.6")
    with pytest.raises(ValueError, match="expert_load takes fractions"):
        Strategy.parse("dp=2,expert_load=a/b")
    with pytest.raises(ValueError, match="needs sequence parallelism"):
        Strategy(dp=2, tp=2, ep=2)
    alone = Strategy(cp=2, overlap_grad_reduce=False)  # gradients reduced over cp ranks, after the backward
    assert Strategy.parse(str(alone)) == alone
    with pytest.raises(ValueError, match="of at least 2"):
        Strategy(dp=4, zero=3, shard=1)


def test_expert_parallelism_adds_four_all_to_alls_per_moe_layer_and_splits_the_expert_gradients(
    mixtral: tuple[Any, Captured],
) -> None:
    micro_tokens = BATCH // 4 * SEQ
    routed = micro_tokens * TOP_K * WIDTH * FP32  # each all-to-all: the rank's routed rows of the width
    plain, ep = _plan(mixtral, "dp=4"), _plan(mixtral, "dp=4,ep=2")
    assert [c for c in _comms(plain) if c[0] == "all_to_all"] == []
    # Dispatch and combine in the forward, their gradients in the backward, in each of the 2 layers.
    assert [c for c in _comms(ep) if c[0] == "all_to_all"] == [("all_to_all", "ep", routed)] * 8
    grads = _comms(ep, "after")
    dense, experts = (
        ("all_reduce", "dp", DENSE_PARAMS * FP32),
        ("all_reduce", "edp", EXPERT_PARAMS // 2 * FP32),
    )
    assert grads.count(dense) == 2 and grads.count(experts) == 2 and len(grads) == 5  # and the embeddings'
    # ep=1: the experts' gradients reduced with the layer's, over all data-parallel ranks, as before.
    assert _comms(plain, "after").count(("all_reduce", "dp", (DENSE_PARAMS + EXPERT_PARAMS) * FP32)) == 2
    assert plain.stages[0].params - ep.stages[0].params == 2 * EXPERT_PARAMS // 2
    assert ep.stages[0].expert_params == 2 * EXPERT_PARAMS // 2
    # ZeRO 1: dense optimizer states over the 4 replicas, the experts' over the 2 holding the same ones.
    mem = fxcost.sim.memory.rank_memory(_plan(mixtral, "dp=4,ep=2,zero=1"), ep.stages[0], 80)
    outer = ep.stages[0].params - 2 * (DENSE_PARAMS + EXPERT_PARAMS // 2)
    assert mem.optimizer == pytest.approx(8 * ((outer + 2 * DENSE_PARAMS) / 4 + 2 * EXPERT_PARAMS // 2 / 2))


def test_a_given_expert_load_bounds_the_step_by_the_busiest_rank(mixtral: tuple[Any, Captured]) -> None:
    balanced = _plan(mixtral, "dp=4,ep=4")
    skewed = _plan(mixtral, "dp=4,ep=4,expert_load=0.4/0.2/0.2/0.2")
    a2a = [c for c in _comms(skewed) if c[0] == "all_to_all"]
    assert a2a == [("all_to_all", "ep", BATCH // 4 * SEQ * TOP_K * WIDTH * FP32 * 0.4 * 4)] * 8
    assert [c for c in _comms(balanced) if c[0] == "all_to_all"] == [(a2a[0][0], "ep", a2a[0][2] / 1.6)] * 8
    with pytest.raises(ValueError, match="expert_load has 2 fractions; the model has 4 experts"):
        _plan(mixtral, "dp=4,ep=2,expert_load=0.5/0.5")


def test_context_parallelism_passes_keys_and_values_around_the_ring(gpt: tuple[Any, Captured]) -> None:
    whole, cp2, cp4 = _plan(gpt, "dp=1"), _plan(gpt, "cp=2"), _plan(gpt, "cp=4")
    for plan, cp in ((cp2, 2), (cp4, 4)):
        kv = 2 * BATCH * SEQ // cp * WIDTH * FP32  # keys and values of the rank's tokens (GPT-2: all heads)
        st = plan.stages[0]
        rings = [c for seg in st.forward + st.backward for c in seg.inside if c.group == "cp"]
        assert [(c.kind, c.nbytes, c.steps) for c in rings] == [("send_recv", kv, cp - 1)] * 2 + [
            ("send_recv", 2 * kv, cp - 1)] * 2  # fmt: skip
        assert all(c.hidden_ms >= 0 for c in rings)  # the step's attention (0 where not priced on a GPU)
        assert plan.tokens == BATCH * SEQ // cp and plan.boundary_bytes == whole.boundary_bytes / cp
        ratio = st.activation_bytes / whole.stages[0].activation_bytes
        assert 0.9 / cp < ratio < 1.1 / cp  # activations split with the sequence
    assert not [c for seg in whole.stages[0].forward for c in seg.inside if c.group == "cp"]
    with pytest.raises(ValueError, match="2\\*cp=64 equal chunks"):
        _plan(gpt, "cp=32")


def test_context_parallelism_splits_matmuls_on_the_tokens_never_a_weight(gpt: tuple[Any, Captured]) -> None:
    """A forward or input-gradient matmul on its rows, a weight gradient on its inner dimension (its result
    keeps the weight's shape), though the vocabulary here is as long as the tokens (256)."""
    from fxcost.lowering.nodes import MATMULS
    from fxcost.sim.context import split_sequence

    nodes = gpt[1].node_batch(BATCH).nodes
    split = split_sequence(nodes, 2, SEQ, BATCH * SEQ)
    pairs = zip(nodes, split, strict=True)
    matmuls = [(a, b) for a, b in pairs if a.op in MATMULS and len(a.in_shapes[-1]) == 2]
    assert matmuls
    for whole, half in matmuls:
        assert half.flops == whole.flops // 2, whole
        weight_grad = whole.out_shapes == half.out_shapes
        assert weight_grad or half.out_shapes[0][0] == whole.out_shapes[0][0] // 2
        assert half.in_shapes[-1][-1] == whole.in_shapes[-1][-1]  # the weight's (or result's) columns


def test_gradients_reduce_over_dp_times_cp_and_experts_over_their_replicas() -> None:
    g = groups_of(Strategy(dp=2, cp=2))
    assert g["dp"] == [[[0, 1, 2, 3]]] and g["cp"] == [[[0, 1], [2, 3]]]
    g = groups_of(Strategy(dp=4, ep=2))
    assert g["ep"] == [[[0, 1], [2, 3]]] and g["edp"] == [[[0, 2], [1, 3]]]
    mem = fxcost.sim.memory.model_state_bytes(1000, Strategy(dp=2, cp=2).data_ranks, 1)
    assert mem == (4000, 4000, 8000 / 4)


def test_a_shared_experts_last_product_is_row_parallel() -> None:
    # Qwen2-MoE's MLP runs a shared expert (gate, up, down) beside the routed ones: its down projection
    # ends its own block and is the row-parallel one, as o_proj is the attention's; the router and the
    # shared expert's gate are the MLP's own.
    from fxcost.sim.layers import layer_of, layers_of
    from fxcost.sim.plan import _last_products

    step = hf_step(QWEN2_MOE, BATCH, SEQ)
    captured = default_estimator().capture(
        step.model, step.inputs, True, loss_fn=step.loss_fn, batch_size=BATCH
    )
    nodes = captured.report.nodes
    known = set(layers_of([n.module for n in nodes if n.phase in ("fw", "bw")]))
    ordered = [
        (n, d) for n, d in zip(nodes, captured.index, strict=True) if n.phase == "fw" and d is not None
    ]
    last = _last_products(ordered, {n.module: layer_of(n.module, known) for n in nodes})
    rows = {
        n.module.split("layers.0.")[1]
        for i, (n, _) in enumerate(ordered)
        if i in last and ".layers.0." in n.module
    }
    assert rows == {"self_attn.o_proj", "mlp.shared_expert.down_proj", "mlp.shared_expert_gate"}


def test_tensor_parallelism_splits_every_experts_weight_like_a_dense_mlp(
    mixtral: tuple[Any, Captured],
) -> None:
    # Each expert's gate/up weight (4 x 64 x 256) is column-parallel, its down weight (4 x 128 x 64)
    # row-parallel: forward and backward, both products run half the FLOPs on half the weight.
    from fxcost.lowering.experts import GROUPED_MM_OPS
    from fxcost.sim.shard import shard_node

    _, captured = mixtral
    grouped = {(n.op, n.in_shapes[1]): n for n in captured.report.nodes if n.op in GROUPED_MM_OPS}
    assert len(grouped) == 4  # two products, forward and backward
    weights = {
        (EXPERTS, WIDTH, 2 * FFN): (EXPERTS, WIDTH, FFN),
        (EXPERTS, FFN, WIDTH): (EXPERTS, FFN // 2, WIDTH),
    }
    for node in grouped.values():
        shard = shard_node(node, 2, WIDTH, BATCH * SEQ)
        assert shard is not None and node.flops is not None
        assert shard.flops == node.flops // 2 and shard.in_shapes[1] == weights[node.in_shapes[1]]
        assert shard.in_shapes[2] == (EXPERTS,)  # every expert's offset stays
        if "backward" in node.op:  # the weight's gradient has the weight's shard
            assert shard.out_shapes[1] == shard.in_shapes[1]


def test_expert_tensor_parallelism_gathers_the_routed_rows_over_tp_around_the_experts(
    mixtral: tuple[Any, Captured],
) -> None:
    # dp=4, tp=2, ep=2: a replica's 64 tokens route 128 rows of the width; each tp rank holds half the
    # sequence, so it sends half the rows to their experts' ranks, gathers the 128 its tp group received,
    # runs its 2 experts' halves on them, and scatters the partial results back before the combine.
    from fxcost.sim.dims import width_and_tokens
    from fxcost.sim.moe import expert_plan

    rows = BATCH // 4 * SEQ * TOP_K * WIDTH * FP32
    sequence = BATCH // 4 * SEQ * WIDTH * FP32
    st = _plan(mixtral, "dp=4,tp=2,sp=1,ep=2").stages[0]
    attention = [("all_gather", "tp", sequence), ("reduce_scatter", "tp", sequence)]
    experts = [("all_to_all", "ep", rows / 2), ("all_gather", "tp", rows), ("reduce_scatter", "tp", rows),
               ("all_to_all", "ep", rows / 2)]  # fmt: skip
    # The router runs on the rank's tokens: no gather of the sequence before the MoE layer.
    assert [[(c.kind, c.group, c.nbytes) for c in seg.inside] for seg in st.forward if seg.layer] == [
        attention + experts
    ] * 2
    assert [[(c.kind, c.group, c.nbytes) for c in seg.inside] for seg in st.backward if seg.layer] == [
        experts + attention
    ] * 2
    assert st.expert_params == 2 * EXPERT_PARAMS // 4  # each expert split over ep, then over tp
    # ZeRO 1: the dense optimizer states over the 4 replicas, the experts' over the 2 holding the same shard.
    zero = _plan(mixtral, "dp=4,tp=2,sp=1,ep=2,zero=1")
    mem = fxcost.sim.memory.rank_memory(zero, zero.stages[0], 80)
    assert mem.optimizer == pytest.approx(8 * ((st.params - st.expert_params) / 4 + st.expert_params / 2))
    dense = _plan(mixtral, "dp=4,tp=2,sp=1").stages[0]
    assert dense.params - (st.params - st.expert_params) == 2 * EXPERT_PARAMS // 2  # the rest: / tp alike
    # The rank runs 2 of the 4 experts, every weight halved (gate/up by columns, down by rows).
    _, captured = mixtral
    nodes = captured.node_batch(BATCH // 4, None).nodes
    forward = [(n, d) for n, d in zip(captured.report.nodes, captured.index, strict=True)
               if n.phase == "fw" and d is not None]  # fmt: skip
    plan = expert_plan(nodes, forward, Strategy.parse("dp=4,tp=2,sp=1,ep=2"), *width_and_tokens(nodes), FP32)
    assert plan is not None
    weights = {
        n.in_shapes[1] for n in plan.nodes.values() if len(n.in_shapes) > 1 and len(n.in_shapes[1]) == 3
    }
    assert weights == {(2, WIDTH, FFN), (2, FFN // 2, WIDTH)}


def test_context_parallelism_splits_the_experts_routed_rows_and_rings_the_keys_not_the_router(
    mixtral: tuple[Any, Captured],
) -> None:
    # 256 tokens route 512 rows; the gate/up weight is 64 x 256, as wide as the tokens: a rank's experts
    # run on its 256 rows with every weight whole. The keys (2 heads of 16: 32 wide) go round the ring,
    # not the router's 4-wide output.
    from fxcost.lowering.experts import GROUPED_MM_OPS
    from fxcost.sim.context import split_sequence

    _, captured = mixtral
    nodes = captured.node_batch(BATCH, None).nodes
    split = split_sequence(nodes, 2, SEQ, BATCH * SEQ)
    grouped = [(a, b) for a, b in zip(nodes, split, strict=True) if a.op in GROUPED_MM_OPS]
    assert len(grouped) == 4
    for whole, half in grouped:
        assert whole.in_shapes[0][0] == BATCH * SEQ * TOP_K and half.in_shapes[0][0] == BATCH * SEQ
        assert half.in_shapes[1] == whole.in_shapes[1] and half.flops == whole.flops // 2
    st = _plan(mixtral, "cp=2").stages[0]
    kv = 2 * BATCH * SEQ // 2 * WIDTH // 2 * FP32
    assert [c.nbytes for seg in st.forward for c in seg.inside if c.group == "cp"] == [kv] * 2


def test_a_shared_expert_is_a_tensor_parallel_block_of_its_own_and_its_gate_routes() -> None:
    # Qwen2-MoE under ep=2, tp=2: the attention and the shared expert each gather the sequence and
    # scatter it; the routed experts exchange their rows; the shared expert's 1-wide gate is routing,
    # no block (it would gather the sequence again). Under cp=2 the ring passes the 32-wide keys, not
    # that gate's single column.
    step = hf_step(QWEN2_MOE, BATCH, SEQ)
    traced = (step.model, default_estimator().capture(step.model, step.inputs, True, loss_fn=step.loss_fn,
                                                      batch_size=BATCH))  # fmt: skip
    rows, sequence = BATCH // 4 * SEQ * TOP_K * WIDTH * FP32, BATCH // 4 * SEQ * WIDTH * FP32
    block = [("all_gather", "tp", sequence), ("reduce_scatter", "tp", sequence)]
    experts = [("all_to_all", "ep", rows / 2), ("all_gather", "tp", rows), ("reduce_scatter", "tp", rows),
               ("all_to_all", "ep", rows / 2)]  # fmt: skip
    st = _plan(traced, "dp=4,tp=2,sp=1,ep=2").stages[0]
    for seg in [seg for seg in st.forward if seg.layer]:
        comms = [(c.kind, c.group, c.nbytes) for c in seg.inside]
        assert sorted(comms) == sorted(block * 2 + experts) and comms[:2] == block
    st = _plan(traced, "cp=2").stages[0]
    kv = 2 * BATCH * SEQ // 2 * WIDTH // 2 * FP32
    assert [c.nbytes for seg in st.forward for c in seg.inside if c.group == "cp"] == [kv] * 2


def test_with_one_expert_per_token_the_rank_still_runs_its_own_experts() -> None:
    # Top-1 routing: the routed rows are as many as the tokens, but they are the rank's experts' rows,
    # not the sequence's: a given load makes the busiest rank's expert GEMMs longer (wide enough here
    # for them to be more than their launch floors).
    config = {**MIXTRAL, "num_experts_per_tok": 1, "hidden_size": 512, "intermediate_size": 1024,
              "num_attention_heads": 8, "num_key_value_heads": 4}  # fmt: skip
    step = hf_step(config, BATCH, 256)
    traced = (step.model, default_estimator().capture(step.model, step.inputs, True, loss_fn=step.loss_fn,
                                                      batch_size=BATCH))  # fmt: skip
    spec = "dp=4,tp=2,sp=1,ep=2"
    balanced, skewed = _plan(traced, spec), _plan(traced, spec + ",expert_load=0.7/0.1/0.1/0.1")
    ratio = sum(seg.compute_ms for seg in skewed.stages[0].forward) / sum(
        seg.compute_ms for seg in balanced.stages[0].forward
    )
    assert ratio > 1.03  # 1.0005 when the sequence's shard priced the grouped GEMMs


def test_a_grouped_gemm_splits_along_the_width_that_is_not_the_models() -> None:
    from fxcost.lowering import recorded_bytes
    from fxcost.records import NodeCost
    from fxcost.sim.context import split_sequence
    from fxcost.sim.shard import shard_node

    def grouped(op: str, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> NodeCost:
        return NodeCost("g", op, "bw", module="layers.0.mlp.experts", in_shapes=ins, out_shapes=outs,
                        in_dtypes=["torch.float32"] * len(ins), out_dtypes=["torch.float32"] * len(outs),
                        flops=1000, bytes_read=recorded_bytes(ins, ["torch.float32"] * len(ins)))  # fmt: skip

    # An expert as wide as the model (GPT-OSS: 2,880 both): its down projection is the row-parallel one.
    down = shard_node(
        grouped("aten._grouped_mm.default", [(512, 64), (4, 64, 64), (4,)], [(512, 64)]), 2, 64, 256
    )
    assert down is not None and down.in_shapes == [(512, 32), (4, 32, 64), (4,)] and down.flops == 500
    # aten's weight gradient, grouped along the rows: [A, S] x [S, B] -> [E, A, B], A the expert's width.
    dw = grouped("aten._grouped_mm.default", [(128, 512), (512, 64), (4,)], [(4, 128, 64)])
    tp = shard_node(dw, 2, 64, 256)
    assert tp is not None and tp.in_shapes[0] == (64, 512) and tp.out_shapes == [(4, 64, 64)]
    # cp: the rows it contracts split, the expert's width (a multiple of the 256 tokens here) whole.
    (cp,) = split_sequence([dw], 2, 32, 256)
    assert cp.in_shapes == [(128, 256), (256, 64), (4,)] and cp.out_shapes == [(4, 128, 64)]


def test_every_moe_layer_of_a_whole_model_runs_expert_tensor_parallelism() -> None:
    # A distinct node names one of the layers that ran it: the MoE blocks are matched by their path with
    # the layer's index wildcarded, so a four-layer model's middle layers are MoE blocks too (they had
    # opened a tensor-parallel region around their experts' gradients) and the whole model simulates as
    # its two traced layers deepened.
    from fxcost.zoo.decoders import Decoder

    m = Decoder("m", layers=4, hidden=64, heads=4, ffn=32, vocab=256, seq=16, gated=True, kv_heads=2,
                experts=4, top_k=2)  # fmt: skip
    strategy, cluster = "tp=2,sp=1,dp=2,ep=2,mb=2", "4xH100-SXM"
    whole = fxcost.simulate(m.hf_config(4, 16), strategy, cluster, batch=8, seqlen=16, precision="bf16")
    deep = fxcost.simulate(
        m.hf_config(2, 16), strategy, cluster, batch=8, seqlen=16, precision="bf16", layers=4
    )
    assert whole.iteration_ms == pytest.approx(deep.iteration_ms, rel=1e-9)
    assert whole.collectives == deep.collectives
