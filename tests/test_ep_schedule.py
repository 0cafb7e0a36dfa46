"""The scheduled-HLO reading of ``jaxmoe.bench.hlo_schedule`` (what XLA overlaps with the EP
exchange, read from a mock-topology compile: docs/expert-parallelism.md, "Overlapping the
exchange"), on a small synthetic module shaped like XLA GPU's scheduled text."""

# ruff: noqa: E501 (an HLO instruction is one line)

from jaxmoe.bench import hlo_schedule

FWD = 'op_name="jit(f)/jvp(jit(_moe_shard))/shard_map/jaxmoe/ep_dispatch/all_to_all"'
BWD = 'op_name="jit(f)/transpose(jvp(jit(_moe_shard)))/shard_map/jaxmoe/ep_combine/all_to_all"'
LOOP = (
    'op_name="jit(f)/transpose(jvp(jit(_moe_shard)))/shard_map/jaxmoe/while/body/'
    'jvp(ep_dispatch)/all_to_all"'
)
SYNC = '"collective_backend_config":{"is_sync":true}'

HLO = f"""HloModule jit_f, is_scheduled=true

%fused_add (p0: f32[4]) -> f32[4] {{
  %p0 = f32[4]{{0}} parameter(0)
  ROOT %add.0 = f32[4]{{0}} add(%p0, %p0)
}}

%body (param.1: (s32[], bf16[4,8,16])) -> (s32[], bf16[4,8,16]) {{
  %param.1 = (s32[], bf16[4,8,16]{{2,1,0}}) parameter(0)
  %get-tuple-element.1 = bf16[4,8,16]{{2,1,0}} get-tuple-element(%param.1), index=1
  %all_to_all.9 = bf16[4,8,16]{{2,1,0}} all-to-all(%get-tuple-element.1), dimensions={{0}}, metadata={{{LOOP} scheduling_name="all-to-all-start.3"}}, backend_config={{{SYNC}}}
  %get-tuple-element.2 = s32[] get-tuple-element(%param.1), index=0
  ROOT %tuple.1 = (s32[], bf16[4,8,16]{{2,1,0}}) tuple(%get-tuple-element.2, %all_to_all.9)
}}

%cond (param.2: (s32[], bf16[4,8,16])) -> pred[] {{
  %param.2 = (s32[], bf16[4,8,16]{{2,1,0}}) parameter(0)
  %get-tuple-element.3 = s32[] get-tuple-element(%param.2), index=0
  %constant.1 = s32[] constant(3)
  ROOT %compare.1 = pred[] compare(%get-tuple-element.3, %constant.1), direction=LT
}}

ENTRY %main (param.0: bf16[4,8,16], param.5: f32[4]) -> (bf16[4,8,16], f32[4], bf16[64,16]) {{
  %param.0 = bf16[4,8,16]{{2,1,0}} parameter(0), metadata={{op_name="x"}}
  %param.5 = f32[4]{{0}} parameter(1)
  %all-to-all-start.1 = ((bf16[4,8,16]{{2,1,0}}), bf16[4,8,16]{{2,1,0}}) all-to-all-start(%param.0), dimensions={{0}}, metadata={{{FWD} scheduling_name="all-to-all-start.1"}}, backend_config={{"collective_backend_config":{{"is_sync":false}}}}
  %mpmd_map.1 = bf16[64,16]{{1,0}} custom-call(%param.0), custom_call_target="mosaic_gpu_v2", metadata={{op_name="jit(f)/jvp(jit(_moe_shard))/shard_map/jaxmoe/experts/anonymous/mpmd_map"}}
  %gemm_fusion_dot.1 = f32[4]{{0}} fusion(%param.5), kind=kCustom, calls=%fused_add, metadata={{op_name="jit(f)/router/dot_general"}}
  %loop_add_fusion = f32[4]{{0}} fusion(%gemm_fusion_dot.1), kind=kLoop, calls=%fused_add
  %all-reduce-start.1 = ((f32[4]{{0}}), f32[4]{{0}}) all-reduce-start(%loop_add_fusion), to_apply=%fused_add
  %constant.2 = s32[] constant(0)
  %tuple.2 = (s32[], bf16[4,8,16]{{2,1,0}}) tuple(%constant.2, %param.0)
  %while.1 = (s32[], bf16[4,8,16]{{2,1,0}}) while(%tuple.2), condition=%cond, body=%body, metadata={{op_name="jit(f)/transpose(jvp(jit(_moe_shard)))/shard_map/jaxmoe/while"}}
  %all-reduce-done.1 = f32[4]{{0}} all-reduce-done(%all-reduce-start.1)
  %all-to-all-done.1 = bf16[4,8,16]{{2,1,0}} all-to-all-done(%all-to-all-start.1), metadata={{{FWD}}}
  %all_to_all.2 = f32[4,8,16]{{2,1,0}} all-to-all(%param.0), dimensions={{0}}, metadata={{{BWD} scheduling_name="all-to-all-start.2"}}, backend_config={{{SYNC}}}
  %bitcast.1 = bf16[4,8,16]{{2,1,0}} bitcast(%all-to-all-done.1)
  %loop_select_fusion = (bf16[4,8,16]{{2,1,0}}, f32[4,8,16]{{2,1,0}}) fusion(%bitcast.1, %all_to_all.2), kind=kLoop, calls=%fused_add
  %get-tuple-element.4 = bf16[4,8,16]{{2,1,0}} get-tuple-element(%loop_select_fusion), index=0
  %pallas_call.1 = bf16[64,16]{{1,0}} custom-call(%get-tuple-element.4), custom_call_target="__gpu$xla.gpu.triton", metadata={{op_name="jit(f)/transpose(jvp(jit(_moe_shard)))/shard_map/jaxmoe/experts/jaxmoe_tgmm/pallas_call"}}
  %cublas.1 = bf16[64,16]{{1,0}} custom-call(%pallas_call.1), custom_call_target="__cublas$gemm"
  ROOT %tuple.3 = (bf16[4,8,16]{{2,1,0}}, f32[4]{{0}}, bf16[64,16]{{1,0}}) tuple(%get-tuple-element.4, %all-reduce-done.1, %cublas.1)
}}
"""


def test_parse_module_keeps_schedule_order_and_finds_the_entry():
    computations, entry = hlo_schedule.parse_module(HLO)
    assert entry == "main"
    assert set(computations) == {"fused_add", "body", "cond", "main"}
    names = [i.name for i in computations["main"]]
    assert names.index("all-to-all-start.1") < names.index("mpmd_map.1")
    assert names.index("mpmd_map.1") < names.index("all-to-all-done.1")
    start = computations["main"][names.index("all-to-all-start.1")]
    assert start.opcode == "all-to-all-start" and start.operands == ["param.0"]


def test_payload_reads_the_result_buffers():
    assert hlo_schedule.payload("((bf16[4,8,16]{2,1,0}), bf16[4,8,16]{2,1,0})") == (
        "bf16[4,8,16]",
        4 * 8 * 16 * 2,
    )
    assert hlo_schedule.payload("f32[4,512,16]{2,1,0}") == ("f32[4,512,16]", 131072)
    text, size = hlo_schedule.payload("(bf16[2,3]{1,0}, f32[2]{0})")  # a combined all-to-all
    assert text == "bf16[2,3], f32[2]" and size == 12 + 8


def test_scope_tells_dispatch_combine_and_passes_apart():
    assert hlo_schedule.scope(FWD[9:-1]) == {
        "scope": "ep_dispatch",
        "pass": "forward",
        "in_loop_body": False,
    }
    assert hlo_schedule.scope(BWD[9:-1])["pass"] == "backward"
    assert hlo_schedule.scope(BWD[9:-1])["scope"] == "ep_combine"
    loop = hlo_schedule.scope(LOOP[9:-1])
    assert loop["in_loop_body"] and loop["pass"] == "backward (recomputed forward)"


def test_exchange_report_classifies_what_sits_between_start_and_done():
    report = hlo_schedule.exchange_report(HLO)
    assert report["async_all_to_all"] == 1 and report["sync_all_to_all"] == 1
    assert report["grouped_matmul_kernels"] == 2
    assert report["most_collectives_in_flight"] == 2  # the all-to-all and the all-reduce
    (exchange,) = report["exchanges"]
    assert exchange["start"] == "all-to-all-start.1" and exchange["done"] == "all-to-all-done.1"
    assert exchange["payload"] == "bf16[4,8,16]" and exchange["bytes"] == 1024
    assert (exchange["scope"], exchange["pass"]) == ("ep_dispatch", "forward")
    assert exchange["between"] == {
        "grouped_matmul": 1,
        "gemm": 1,
        "fusion": 1,
        "collective": 2,  # all-reduce start and done
        "while": 1,
        "conditional": 0,
        "other": 0,
    }
    assert [k["name"] for k in exchange["grouped_matmul_between"]] == ["mpmd_map.1"]
    assert exchange["gemm_between"] == ["gemm_fusion_dot.1"]
    assert exchange["while_between"][0]["name"] == "while.1"
    # pallas_call.1 reads the received rows; mpmd_map.1 reads only the parameter.
    assert (exchange["kernels_after"], exchange["kernels_before"]) == (1, 0)
    assert exchange["kernels_independent"] == 1
    assert exchange["first_user"] == {
        "name": "loop_select_fusion",
        "class": "fusion",
        "reads": ["all-to-all-done.1", "all_to_all.2"],
    }


def test_exchange_report_lists_sync_all_to_alls_with_their_scope():
    report = hlo_schedule.exchange_report(HLO)
    entry_sync, loop_sync = report["sync_exchanges"]
    assert entry_sync["computation"] == "main" and entry_sync["name"] == "all_to_all.2"
    assert (entry_sync["scope"], entry_sync["pass"]) == ("ep_combine", "backward")
    assert entry_sync["scheduled_as"] == "all-to-all-start.2" and entry_sync["is_sync"]
    assert entry_sync["bytes"] == 4 * 8 * 16 * 4
    assert loop_sync["computation"] == "body" and loop_sync["in_loop_body"]
    (loop,) = report["loops"]
    assert loop["name"] == "while.1" and loop["holds_collectives"]
    assert report["while_loops"] == 1


def test_markdown_table_has_a_row_per_all_to_all():
    table = hlo_schedule.markdown_table(hlo_schedule.exchange_report(HLO))
    rows = table.splitlines()[2:]
    assert len(rows) == 3
    assert "`all-to-all-start.1`" in rows[0] and "mpmd_map.1 (for)" in rows[0]
    assert "**sync**" in rows[1] and "ep_combine" in rows[1]
    assert "loop body `body`" in rows[2]
