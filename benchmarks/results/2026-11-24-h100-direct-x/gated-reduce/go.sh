source benchmarks/gpu_session.sh none >/dev/null 2>&1; export OUT
B=""
for l in ${BUILDS:-base gl3 gl4 gl6}; do B="$B;$l:reduce_gated_split=${l}.spv"; done
B=${B#;}
python3 .exp/gl/swap.py 4b 32,1 "$B" 64 2>&1 | tee $OUT/swap-gl.txt
