source benchmarks/gpu_session.sh none >/dev/null 2>&1; export OUT
B=""
for l in base n1m4t4x2 n2m2t2x4 n4m2t1x4 n4m4t1x2 n2m8t2x1 n1m8t4x1; do B="$B;$l:coop_t16_fold=${l}_t16_fold.spv,coop_gated_t16_fold=${l}_gated_t16_fold.spv"; done
B=${B#;}
python3 .exp/pf/pfswap.py 4b "$B" 32x128,32x512 2>&1 | tee $OUT/pfswap.txt
