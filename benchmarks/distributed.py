"""Multi-GPU iterations simulated against Megatron-LM measurements (data, tensor, pipeline parallel).

For every ``DIR/models/<Device>/<model>-train-<seqlen>-<batch>-{dp4,tp4,pp4_<m>}.json`` (4 GPUs of that
type in one NVLink node; Megatron-LM core r0.5 through accelerate, fp32, no sequence parallelism,
no recomputation, no distributed optimizer; ``e2e_latency`` = forward + backward of one global batch),
the model of ``DIR/model_configs/<model>.json`` is traced once per micro-batch size on meta tensors
and its iteration simulated for the same setup on ``4x<Device>``: ``dp=4``; ``tp=4``; ``pp=4`` with
``m`` micro-batches (1F1B). The measured timer leaves the optimizer step out, so the prediction is the
simulated ``forward_backward_ms``. Prints predicted, measured and error per row.

Modelling the measured software, not tuning to it:

- the node is an NVSwitch/NVLink node; its links come from the device database and
  ``fxcost.sim.cluster``'s defaults (NVLink per direction at NCCL-tests' all-reduce efficiency);
- Megatron-LM r0.5 reduces data-parallel gradients after the backward (its DDP's
  ``overlap_grad_reduce`` is off by default): ``overlap=0``;
- Megatron's GPT runs GELU (tanh approximation) as one fused kernel; Hugging Face's GPT-2 config asks
  for ``gelu_new``, eight elementwise kernels each way. The traced model uses ``gelu_pytorch_tanh``,
  the same function in one kernel (``--hf-activation`` keeps the config's).

Last line: ``mape_dist=.. max_err_dist=.. rows=N``.

    python benchmarks/distributed.py --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings

from fxcost.data.datasets import data_root
from fxcost.gpus import get_device
from fxcost.sim import simulate

_RUN = re.compile(r"^(?P<model>.+)-train-(?P<seqlen>\d+)-(?P<batch>\d+)-(?P<plan>dp4|tp4|pp4_\d+)$")


def strategy_of(plan: str) -> str:
    """The strategy a run's suffix names, with Megatron's non-overlapped gradient reduction."""
    if plan == "dp4":
        return "dp=4,overlap=0"
    if plan == "tp4":
        return "tp=4"
    micro_batches = int(plan.split("_")[1])
    return f"pp=4,mb={micro_batches},schedule=1f1b"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data", help="shared data directory")
    parser.add_argument("--hf-activation", action="store_true", help="keep the config's activation function")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    root = data_root(args.data)
    runs = sorted(p for p in (root / "models").glob("*/*.json") if _RUN.match(p.stem))
    if not runs:
        print(f"no multi-GPU runs under {root / 'models'}", file=sys.stderr)
        return 1
    start = time.perf_counter()
    errors = []
    print(f"{'device':22s} {'model':12s} {'seq':>5s} {'batch':>5s} {'strategy':28s} "
          f"{'predicted':>10s} {'measured':>10s} {'error':>7s}")  # fmt: skip
    for path in runs:
        m = _RUN.match(path.stem)
        assert m is not None
        device = get_device(path.parent.name.replace("_", " ")).name
        config = json.loads((root / "model_configs" / f"{m['model']}.json").read_text())
        if not args.hf_activation and config.get("activation_function") == "gelu_new":
            config["activation_function"] = "gelu_pytorch_tanh"
        strategy = strategy_of(m["plan"])
        batch, seqlen = int(m["batch"]), int(m["seqlen"])
        result = simulate(config, strategy, f"4x{device}", batch=batch, seqlen=seqlen)
        measured = json.loads(path.read_text())["e2e_latency"]
        error = (result.forward_backward_ms - measured) / measured * 100
        errors.append(error)
        print(f"{device:22s} {m['model']:12s} {seqlen:5d} {batch:5d} {strategy:28s} "
              f"{result.forward_backward_ms:10.1f} {measured:10.1f} {error:+6.1f}%", flush=True)  # fmt: skip
    link = result.cluster.intra
    print(f"link model: {link.name or 'intra-node'}, {link.bandwidth_gbps:.0f} GB/s per direction per GPU, "
          f"{link.latency_us} us per hop ({time.perf_counter() - start:.0f} s)")  # fmt: skip
    mape = sum(abs(e) for e in errors) / len(errors)
    print(f"mape_dist={mape:.2f} max_err_dist={max(abs(e) for e in errors):.2f} rows={len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
