source benchmarks/gpu_session.sh none >/dev/null 2>&1; export OUT
python3 .exp/gl/swap.py 4b 32,1 "before:reduce_gated_split=base.spv;shipped:" 64 2>&1 | tee $OUT/swap-final.txt
for f in vulkan_split vulkan_coopmat vulkan_backend vulkan_quant batch_invariance; do
  timeout 300 python3 -m pytest -q -x tests/test_$f.py 2>&1 | tail -1 | sed "s/^/$f: /"
done | tee $OUT/tests.txt
timeout 150 python3 benchmarks/side_by_side.py --shape 4b --batch 1,32 --prompt-len 128 --gen-len 128 --backend vulkan --out $OUT/side-by-side 2>&1 | tail -6
timeout 170 python3 -m gemma_batch bench --shape 27b --batch 1,32 --prompt-len 128 --gen-len 128 --backend vulkan --json $OUT/bench-27b.json 2>&1 | tail -3
