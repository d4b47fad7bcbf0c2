#!/bin/bash
# Builds .exp/xpf/<label>_<kind>.spv from direct_variants.comp (copied to .exp/xpf/direct.comp):
# matmul_coop_direct.comp as shipped before (base) and with the switches below, for the three
# fp16-tile decode variants (plain, GATED, ROWS).
set -e
cd "$(git rev-parse --show-toplevel)"
G=${GLSLANG:-glslang}
while read label defs; do
  [ -z "$label" ] && continue
  for kind in "t16:" "gated_t16:GATED" "rows_t16:ROWS"; do
    k=${kind%%:*}; d=${kind#*:}
    $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -Ishaders $( [ -n "$d" ] && echo -D$d ) $(for x in $defs; do echo -D$x; done) .exp/xpf/direct.comp -o .exp/xpf/${label}_$k.spv >/dev/null
  done
done <<'V'
base
xpf XPF
w2 W2
xpfw2 XPF W2
xpflr XPF LR
xpfdb XPF DB
xpfdblr XPF DB LR
xpfw8 XPF SG_N=8
xpfk2 XPF KS=2
V
