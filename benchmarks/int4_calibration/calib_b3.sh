cd /tmp/exp && . /work/main/.venv/bin/activate
run() { echo "### $(date -Is) $*"; /usr/bin/time -f "[wall %es, maxrss %MkB]" "$@" 2>&1; }
run python diaglib.py /tmp/exp/calib_self_2k.txt /tmp/exp/D_self_2k.npy
run python diaglib.py /tmp/exp/calib_self.txt /tmp/exp/D_self.npy
run python cmp_diag.py /tmp/exp/D_self.npy /tmp/exp/H_self.npy
run python -c "
import numpy as np
d=np.load('/tmp/exp/D_self.npy',allow_pickle=True).item()['d']
print('thread-safe D_self: max |k/q-1|, |v/q-1|, |up/gate-1| over layers:', max(abs(d[f'layers.{L}.self_attn.k_proj.weight'].sum()/d[f'layers.{L}.self_attn.q_proj.weight'].sum()-1) for L in range(18)), max(abs(d[f'layers.{L}.self_attn.v_proj.weight'].sum()/d[f'layers.{L}.self_attn.q_proj.weight'].sum()-1) for L in range(18)), max(abs(d[f'layers.{L}.mlp.up_proj.weight'].sum()/d[f'layers.{L}.mlp.gate_proj.weight'].sum()-1) for L in range(18)))"
run python diaglib.py /tmp/exp/calib_docs_8k.txt /tmp/exp/D_docs_8k.npy
run python rtn_diag.py "self-7k=/tmp/exp/D_self.npy" "self-2k=/tmp/exp/D_self_2k.npy" "docs-8k=/tmp/exp/D_docs_8k.npy" "self-7k(racy old H_self)=/tmp/exp/H_self.npy"
run python diaglib.py /tmp/exp/calib_docs.txt /tmp/exp/D_docs.npy
run python rtn_diag.py "docs-30k=/tmp/exp/D_docs.npy"
