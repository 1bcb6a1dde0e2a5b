#!/usr/bin/env bash
# Issues 9 and 10 on the local CUDA GPU in one call: each step is time-boxed and logged on its own,
# so a failing step costs only itself.
#
#   bash benchmarks/gpu_validation.sh OUT [STEP...]      STEP: env tests calibrate collect traces
#                                                          (default: all, in that order)
# OUT gets env.txt and one <step>.log per step, calibration.yaml, and data.tgz holding collect/ (the
# rows of `fxcost collect`) and the traces of record_gpu_traces.py, which go to benchmarks/fixtures/gpu
# first (cases recorded there already are skipped, so a second call resumes).
# Knobs (environment): DEADLINE_S (default 560: the traces stop by then, so the call ends in time),
# COLLECT_OPS (default linear,bmm,conv,elementwise,ln,softmax), COLLECT_SAMPLES (default 200),
# COLLECT_S (default 180), PYTHON (default python3).
set -u
out=${1:?usage: gpu_validation.sh OUT [STEP...]}
shift
steps=${*:-env tests calibrate collect traces}
mkdir -p "$out"
py=${PYTHON:-python3}
deadline=${DEADLINE_S:-560}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fixtures=benchmarks/fixtures/gpu

step() {  # step NAME SECONDS COMMAND...: run COMMAND under a time limit, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    local began=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - began)) s (limit $limit s)"
    tail -n 25 "$out/$name.log"
}

for s in $steps; do
    case $s in
    env)
        { nvidia-smi; $py -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda,
"triton", triton.__version__, "gpu", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))'
          $py -m pip list 2>/dev/null | grep -i -E '^(torch|triton|transformers|numpy|rich|pyyaml) '; } >"$out/env.txt" 2>&1
        tail -n 8 "$out/env.txt" ;;
    tests)
        # every test marked cuda is in these files; their other tests run on the GPU too
        step tests 240 $py -m pytest -q -p no:cacheprovider tests/kernels_triton/test_kernels_triton.py \
            tests/kernels_triton/test_reference_kernels.py tests/passes/test_measure.py \
            tests/data/test_collect.py ;;
    calibrate)
        step calibrate 150 $py -m fxcost calibrate --out "$out/calibration.yaml" ;;
    collect)
        step collect "${COLLECT_S:-180}" $py -m fxcost collect --out "$out/collect" \
            --ops "${COLLECT_OPS:-linear,bmm,conv,elementwise,ln,softmax}" --samples "${COLLECT_SAMPLES:-200}" ;;
    traces)
        left=$((deadline - SECONDS))
        if ((left > 30)); then
            step traces "$left" $py benchmarks/record_gpu_traces.py --out "$fixtures"
        else
            echo "== traces: skipped, only $left s left before the deadline"
        fi ;;
    *) echo "unknown step $s (steps: env tests calibrate collect traces)" >&2; exit 2 ;;
    esac
done
tar czf "$out/data.tgz" $(ls -d "$out/collect" "$fixtures" 2>/dev/null) 2>/dev/null
echo "== done in $SECONDS s: $(ls "$out" | tr '\n' ' ')"
