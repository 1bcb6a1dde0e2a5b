"""The ``fxcost plan`` subcommand: search the parallel plans of a decoder on a cluster."""

from __future__ import annotations

import argparse

from fxcost._progress import progress_bars
from fxcost.cli.status import OK

__all__ = ["plan_command"]


def plan_command(args: argparse.Namespace) -> int:
    """Search parallel plans (tp, pp, cp, ep, dp, micro-batch, ZeRO, recompute, sp, vpp) of a decoder.

    MODEL is a named decoder (llama-8b, llama-70b, gpt3-1.3b, gpt3-175b, mixtral-8x7b, deepseek-v3) or a
    Hugging Face config.json of a decoder-only model (dense, or experts: Mixtral, Qwen3-MoE, OLMoE,
    Qwen2-MoE, DeepSeek-V2 and -V3). Every valid plan is ranked by an analytic 1F1B estimate under the
    GPUs' memory, the fastest that fit are simulated exactly, and the best are printed: iteration time,
    tokens/s (and per GPU), MFU, memory per GPU and the OOM verdict. --csv writes every candidate."""
    from fxcost.sim.search import plan

    with progress_bars() as update:
        result = plan(
            args.model,
            args.cluster,
            args.batch,
            args.seqlen,
            precision=args.precision,
            exact=args.exact,
            progress=update,
        )
    print(result.table(args.top))
    if args.csv:
        print(f"{len(result.candidates)} plans written to {result.to_csv(args.csv)}")
    return OK
