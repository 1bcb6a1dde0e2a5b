"""Architecture search under a time budget: Optuna picks a transformer, fxcost prices each candidate.

The study chooses the width, depth and batch size of a GPT-2-style model to train on a GPU you may
not have, maximizing the work one step does (parameters x tokens per step, a proxy for how much the
model learns per step) while its predicted step time stays within a budget. Every trial is priced by
``fxcost.Estimator`` without running anything: the first trial of an architecture traces it
(seconds), trials that only change the batch reuse that trace (milliseconds). Candidates over budget
are pruned.

    pip install 'fxcost[search]'
    python examples/automl_optuna.py --device H100-SXM --budget-ms 150 --trials 40

The search space is small enough to read and easy to widen (``suggest`` below).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import optuna

import fxcost
from fxcost import zoo


@dataclass(frozen=True)
class Best:
    dim: int
    layers: int
    batch: int
    step_ms: float
    params: int
    trials: int
    pruned: int


def search(
    device: str,
    budget_ms: float,
    trials: int,
    seq: int = 256,
    vocab: int = 8192,
    max_layers: int = 12,
    seed: int = 0,
) -> Best:
    """Run the study and return its best trial."""
    estimator = fxcost.Estimator(devices=[device])

    def objective(trial: optuna.Trial) -> float:
        dim = 64 * trial.suggest_int("dim_x64", 2, 16)  # 128 ... 1024
        layers = trial.suggest_int("layers", 1, max_layers)
        batch = 2 ** trial.suggest_int("log2_batch", 1, 6)  # 2 ... 64
        # One architecture is built once, at a fixed batch: other batches reuse its trace. It is built
        # with real weights, not on the meta device: there its F.cross_entropy (nll_loss) has no
        # autograd formula, and the step would be traced without its backward.
        model, inputs = zoo.build("gpt2", 2, seq=seq, vocab=vocab, dim=dim, heads=dim // 64, layers=layers)
        step = estimator.cost(model, inputs, batch_size=batch, device=device)
        params = sum(p.numel() for p in model.parameters())
        trial.set_user_attr("step_ms", step.ms)
        trial.set_user_attr("params", params)
        if step.ms > budget_ms:
            raise optuna.TrialPruned(f"{step.ms:.1f} ms per step is over the {budget_ms} ms budget")
        return params * batch * seq / 1e9

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=trials)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    if pruned == len(study.trials):
        raise RuntimeError(f"no candidate fits {budget_ms} ms per step on {device}; raise --budget-ms")
    best = study.best_trial
    return Best(
        dim=64 * best.params["dim_x64"],
        layers=best.params["layers"],
        batch=2 ** best.params["log2_batch"],
        step_ms=best.user_attrs["step_ms"],
        params=best.user_attrs["params"],
        trials=len(study.trials),
        pruned=pruned,
    )


def main(argv: list[str] | None = None) -> Best:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="H100-SXM", help="the GPU to search for (fxcost devices)")
    parser.add_argument("--budget-ms", type=float, default=150.0, help="the most a training step may take")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--max-layers", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    best = search(args.device, args.budget_ms, args.trials, args.seq, args.vocab, args.max_layers, args.seed)
    elapsed = time.perf_counter() - start
    print(f"{best.trials} trials ({best.pruned} over budget) in {elapsed:.1f} s on this machine")
    print(f"best on {args.device} within {args.budget_ms} ms per step: dim {best.dim}, {best.layers} layers, "
          f"batch {best.batch} x {args.seq} tokens, {best.params / 1e6:.1f}M parameters, "
          f"predicted {best.step_ms:.1f} ms per step")  # fmt: skip
    return best


if __name__ == "__main__":
    main()
