source benchmarks/gpu_session.sh none >/dev/null 2>&1; export OUT
B=""
for l in ${BUILDS:-base xpf xpfw8 xpfk2}; do B="$B;$l:coop_t16=${l}_t16.spv,coop_gated_t16=${l}_gated_t16.spv,coop_rows_t16=${l}_rows_t16.spv"; done
B=${B#;}
python3 .exp/xpf/swap.py 4b 1,32 "$B" 64 2>&1 | tee $OUT/swap-3.txt
for f in split coopmat tiles backend quant kv_dtypes; do
  timeout 300 python3 -m pytest -q -x tests/test_vulkan_$f.py 2>&1 | tail -2 | sed "s/^/$f: /"
done | tee $OUT/tests.txt
timeout 300 python3 -m pytest -q -x tests/test_batch_invariance.py 2>&1 | tail -2 | tee -a $OUT/tests.txt
