cd /tmp/exp && . /work/main/.venv/bin/activate
run() { echo "### $(date -Is) $*"; /usr/bin/time -f "[wall %es, maxrss %MkB]" "$@" 2>&1; }
run python diaglib.py /tmp/exp/calib_self.txt /tmp/exp/D_self.npy
run python -c "
import numpy as np, sys; sys.path.insert(0,'/tmp/exp'); from diaglib import load_diag
a=load_diag('/tmp/exp/D_self.npy'); b=load_diag('/tmp/exp/H_self.npy')
r=max(float(np.max(np.abs(a[k]-b[k])/np.maximum(np.abs(b[k]),1e-30))) for k in b)
print('D_self vs diag(H_self): matrices', len(a), len(b), 'max rel diff', r)"
run python rtn_diag.py "baseline-repro 24k-self=/tmp/exp/H_self.npy,/tmp/exp/H_self2.npy"
