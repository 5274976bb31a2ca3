#!/bin/bash
# The checks that need a GPU, as one prepared run on a machine with one CUDA GPU that may have no network (a cluster's
# compute node, a cloud GPU rented by the minute). Its image needs torch, lightning, tensorboard, torchmetrics and
# pytest; bring the other wheels and the data along, prepared on a machine that has the network:
#
#   echo /.gpu/ >> .git/info/exclude && mkdir -p .gpu/whl .gpu/data/FashionMNIST/raw
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .gpu/whl jsonargparse==4.53.0 docstring_parser==0.18.0 \
#       typeshed_client==2.15.0 torch-optimizer==0.3.0 pytorch-ranger==0.1.1 HolisticTraceAnalysis==0.5.0 plotly==7.1.0
#   for f in ../shared/data/FashionMNIST/raw/*; do gzip -c $f > .gpu/data/FashionMNIST/raw/$(basename $f).gz; done
#
# then copy the checkout with .gpu/ to the GPU machine and run one or more stages per call; each stage has a hard
# timeout of its own (seconds below), so that the first three fit in 15 minutes of GPU time:
#   bash benchmarks/gpu_checks.sh tests     # 120 s: GPU-only tests: sync-free step (breakdown on), CudaEvents, dp,
#                                           #   fast path
#   bash benchmarks/gpu_checks.sh p1        # 300 s: host time per step on the GPU (benchmarks/host_time.py): bare loop
#                                           #   and train.py, cnn at batch 128 and 512, fp32 and bf16-mixed; the four
#                                           #   rows of the host-time table at batch 128 fp32
#   bash benchmarks/gpu_checks.sh windows   # 240 s: the breakdown's cost in one process, 20 + 20 alternating windows
#                                           #   of 200 steps, sampled on / paused, fp32 and bf16 (breakdown_windows.py)
#   bash benchmarks/gpu_checks.sh syncs     # = trace below: synchronising CUDA calls, breakdown on and off
# and the longer stages:
#   bash benchmarks/gpu_checks.sh compile   # 480 s: torch.compile (default, reduce-overhead) against eager, cnn and
#                                           #   gpu_cnn, compile time in the first step, TORCH_LOGS=recompiles
#   bash benchmarks/gpu_checks.sh record    # 540 s: the GPU records (94 % in <= 2 s, 95 % in <= 15 s): candidates on
#                                           #   fast_gpu.yaml chosen on held-out images in one process
#                                           #   (benchmarks/gpu_record.py, 160 s; took 95 s on an H200), then each
#                                           #   target's choice over 5 seeds in fresh processes with the test split
#                                           #   (recipe_runs, 150 s and 220 s: a run took 23-29 s and 40-42 s there)
#   bash benchmarks/gpu_checks.sh graphs    # 150 s: the search's CUDA-graph candidates alone (compile reduce-overhead)
#   bash benchmarks/gpu_checks.sh narrow    # 160 s + 180 s a choice: 94 % in 2 s with cheaper networks
#                                           #   (benchmarks/gpu_record.py's PoolFirstGpuCNN, NarrowGpuCNN) timed
#                                           #   against gpu_cnn 8 ep in one search, then pool-first 12 ep (chosen on
#                                           #   a CPU) over 5 seeds, and the search's choice if it differs
#   bash benchmarks/gpu_checks.sh trace     # sync calls in a profiled window, breakdown on/off; its split against HTA
#   bash benchmarks/gpu_checks.sh cost      # the breakdown's cost, fp32: 10 interleaved on/off pairs
#   bash benchmarks/gpu_checks.sh cost16    # the same in bf16-mixed
#   bash benchmarks/gpu_checks.sh mfu       # 330 s: MFU of the default recipe (fp32, 3 epochs), fast_gpu.yaml and
#                                           #   record_gpu.yaml, the breakdown on (which part bounds each): their
#                                           #   start-block FLOPs and peak, epoch lines and step-time lines
#   bash benchmarks/gpu_checks.sh recorder  # 300 s: NCCL's flight recorder: images/sec with it on (train.py's default)
#                                           #   and off, interleaved pairs, cnn at batch 128 and gpu_cnn at 1000
#                                           #   (ddp, 1 GPU); a hang made on purpose (benchmarks/nccl_hang.py) and
#                                           #   fr_trace reading its dump
#   bash benchmarks/gpu_checks.sh ema       # callbacks.WeightEMA against Lightning's EMAWeightAveraging (which reads
#                                           # its update count from the device every step), 10 pairs, same decay
# Timing on an H200 (2026-11-26): tests 10 s; each train.py run of trace and cost about 20 s, so a cost stage takes
# 40 s per pair (PAIRS=6: 4 min). 15 minutes of GPU time hold the start, tests, trace and one cost or ema stage at 10
# pairs. Everything it prints is also written under $OUT (default /tmp/gpu-checks). Quote a figure with the machine
# and the torch version it prints (an image's torch may be older than setup.cfg's floor: say so).
set -u -o pipefail
out=${OUT:-/tmp/gpu-checks}
data=/tmp/fashion-mnist  # unpacked outside the tree: the carried copy stays small
mkdir -p "$out" /tmp/site $data/FashionMNIST/raw
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
for f in .gpu/data/FashionMNIST/raw/*.gz; do gunzip -c "$f" > $data/FashionMNIST/raw/$(basename "${f%.gz}"); done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FASHION_MNIST_DIR=$data
{ nvidia-smi -L; python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)"; } \
    | tee "$out/machine.txt"
limit() { timeout --kill-after=10 "$@"; }  # each stage's hard limit; the device keeps its own 10-minute one
for stage in "${@:-tests}"; do
    case "$stage" in
        p1) for precision in 32-true bf16-mixed; do for batch in 128 512; do
                limit 70 python3 -m benchmarks.host_time --accelerator gpu --network cnn --batch_size $batch \
                    --precision $precision --rows bare,train.py --repeats 2 2>&1 | tail -7 | tee -a "$out/p1.txt"
            done; done
            limit 100 python3 -m benchmarks.host_time --accelerator gpu --repeats 2 \
                --rows bare,lightning,reference,train.py 2>&1 | tail -9 | tee -a "$out/p1.txt" ;;
        windows) for precision in 32-true bf16-mixed; do
                     limit 120 python3 -m benchmarks.breakdown_windows --accelerator gpu --precision $precision \
                         --timeout 110 2>&1 | tail -2 | tee -a "$out/windows.txt"
                 done ;;
        compile) for network in cnn gpu_cnn; do for mode in false true reduce-overhead; do
                     TORCH_LOGS=recompiles limit 75 python3 train.py --accelerator gpu --network $network \
                         --model.compile $mode --precision bf16-mixed --epochs 2 --test_after_fit false \
                         --trainer.default_root_dir /tmp/compile-runs 2>&1 \
                         | grep -E "First training step|Epoch|[Rr]ecompil" \
                         | sed "s/^/$network compile=$mode: /" | tee -a "$out/compile.txt"
                 done; done ;;
        record) limit 160 python3 -m benchmarks.gpu_record --budget 100 --summary "$out/search.md" \
                    --choice /tmp/choice.txt > "$out/search-log.txt" 2>&1; cat "$out/search.md"
                seconds=150
                while read -r target flags; do  # shellcheck disable=SC2086: the flags are words
                    echo "target $target: $flags" | tee -a "$out/record.txt"
                    limit $seconds python3 -m benchmarks.recipe_runs configs/recipes/fast_gpu.yaml --runs 5 -- $flags \
                        2>&1 | tee -a "$out/record.txt"
                    seconds=220
                done < /tmp/choice.txt ;;
        graphs) limit 150 python3 -m benchmarks.gpu_record --budget 100 --summary "$out/graphs.md" \
                    --choice /tmp/graphs-choice.txt --only "gpu_cnn 8 ep, reduce-overhead" \
                    "staged_cnn (the CPU record's), lr 0.02, 8 ep, {mode}" > "$out/graphs-log.txt" 2>&1
                cat "$out/graphs.md" ;;
        narrow) limit 160 python3 -m benchmarks.gpu_record --budget 110 --summary "$out/narrow.md" \
                    --choice /tmp/narrow-choice.txt --only "gpu_cnn 8 ep, eager" "narrow 48/96/192, 8 ep, {mode}" \
                    "pool-first 64/128/256, 8 ep, {mode}" "pool-first 64/128/256, 10 ep, {mode}" \
                    "pool-first 64/128/256, 12 ep, {mode}" > "$out/narrow-log.txt" 2>&1
                cat "$out/narrow.md"
                # First the choice made on a CPU, on held-out images over seeds (docs/lab/recipes.md, "Chosen on a
                # CPU"), then the search's own if it differs (one seed, on this GPU)
                chosen=$(python3 -c "from benchmarks.gpu_record import CANDIDATES; print(' '.join(f.format(
                    mode='false') for f in CANDIDATES['pool-first 64/128/256, 12 ep, {mode}'][2]))")
                { echo "0.94 $chosen"; cat /tmp/narrow-choice.txt; } | awk '!seen[$0]++' > /tmp/narrow-runs.txt
                while read -r target flags; do  # shellcheck disable=SC2086: the flags are words
                    echo "target $target: $flags" | tee -a "$out/narrow-record.txt"
                    limit 180 python3 -m benchmarks.recipe_runs configs/recipes/fast_gpu.yaml --runs 5 -- $flags \
                        2>&1 | tee -a "$out/narrow-record.txt"
                done < /tmp/narrow-runs.txt ;;
        tests) limit 120 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_sync_free_step.py \
                   tests/unit/test_step_time.py \
                   tests/unit/test_dp.py tests/unit/test_fast_path.py 2>&1 | tee "$out/tests.txt" ;;
        trace|syncs) for precision in 32-true bf16-mixed; do
                   limit 150 python3 -m benchmarks.gpu_trace --precision $precision 2>&1 | grep -v "^Parsed\|^leaving\|INFO" \
                       | tee -a "$out/trace.txt"
               done ;;
        cost) python3 -m benchmarks.step_time_cost --accelerator gpu --devices 1 --pairs "${PAIRS:-10}" 2>&1 \
                  | tee "$out/cost-fp32.txt" ;;
        cost16) python3 -m benchmarks.step_time_cost --accelerator gpu --devices 1 --pairs "${PAIRS:-10}" \
                    --precision bf16-mixed 2>&1 | tee "$out/cost-bf16.txt" ;;
        mfu) # --peak_flops: the H100 SXM's dense figures in Lightning's table (an H200 is the same GH100 compute; the
             # table's H200 entries are NVIDIA's figures with sparsity, and a name without SXM1/NVL1 is not found there):
             # TF32 for the fp32 run (cuDNN's convolutions run in TF32 by default), bf16 for the records
             while read -r name seconds peak flags; do  # shellcheck disable=SC2086: the flags are words
                 limit "$seconds" python3 train.py --accelerator gpu $flags --peak_flops "$peak" --breakdown true \
                     --test_after_fit false --trainer.default_root_dir /tmp/mfu-runs 2>&1 \
                     | grep -E "training FLOPs|peak FLOP|^Epoch|^Step time" | sed "s/^/$name: /" | tee -a "$out/mfu.txt"
             done <<'RUNS'
default 100 4.947e14
fast_gpu 90 9.894e14 --config configs/recipes/fast_gpu.yaml
record_gpu 140 9.894e14 --config configs/recipes/record_gpu.yaml
RUNS
             ;;
        recorder) for pair in 1 2 3 4 5; do for network in cnn:128 gpu_cnn:1000; do
                      name=${network%:*} batch=${network#*:}
                      for mode in on off; do  # off: the buffers at 0, as torch has them by default
                          if [ $mode = off ]; then off="TORCH_NCCL_TRACE_BUFFER_SIZE=0 TORCH_FR_BUFFER_SIZE=0"; else off=; fi
                          env $off limit 60 python3 train.py --accelerator gpu --strategy ddp --devices 1 --network "$name" \
                              --batch_size "$batch" --epochs 1 --test_after_fit false \
                              --trainer.default_root_dir /tmp/recorder-runs 2>&1 \
                              | grep -E "^Epoch|flight recorder" | sed "s/^/$name $mode $pair: /" | tee -a "$out/recorder.txt"
                      done; done; done
                  limit 60 python3 -m benchmarks.nccl_hang /tmp/nccl-hang 2>&1 | tail -5 | tee -a "$out/recorder.txt"
                  ls -l /tmp/nccl-hang | tee -a "$out/recorder.txt"
                  limit 60 python3 -m torch.distributed.flight_recorder.fr_trace /tmp/nccl-hang --prefix nccl-trace-rank \
                      2>&1 | tail -40 | tee -a "$out/recorder.txt" ;;
        ema) python3 -m benchmarks.step_time_cost --accelerator gpu --devices 1 --pairs "${PAIRS:-10}" \
                 --on="--trainer.callbacks+=callbacks.WeightEMA" \
                 --off="--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging --trainer.callbacks.decay 0.99" \
                 2>&1 | tee "$out/ema.txt" ;;
        *) echo "gpu_checks.sh: unknown stage ${stage}: give tests, p1, windows, syncs, trace, compile, record," \
                "graphs, narrow, cost, cost16, mfu, recorder or ema" >&2; exit 2 ;;
    esac
done
