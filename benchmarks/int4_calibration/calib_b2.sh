cd /tmp/exp && . /work/main/.venv/bin/activate
run() { echo "### $(date -Is) $*"; /usr/bin/time -f "[wall %es, maxrss %MkB]" "$@" 2>&1; }
run python diaglib.py /tmp/exp/calib_self_2k.txt /tmp/exp/D_self_2k.npy
run python -c "import sys; sys.path.insert(0,'/tmp/exp'); from qlib import collect_hessians; collect_hessians('/tmp/exp/calib_self_2k.txt','/tmp/exp/H_self_2k_full.npy')"
run python cmp_diag.py /tmp/exp/D_self_2k.npy /tmp/exp/H_self_2k_full.npy
run python diaglib.py /tmp/exp/calib_docs_8k.txt /tmp/exp/D_docs_8k.npy
run python rtn_diag.py "self-7k(H_self)=/tmp/exp/H_self.npy" "self-7k(fresh diag)=/tmp/exp/D_self.npy" "self-2k=/tmp/exp/D_self_2k.npy" "docs-8k=/tmp/exp/D_docs_8k.npy"
run python diaglib.py /tmp/exp/calib_docs.txt /tmp/exp/D_docs.npy
run python rtn_diag.py "docs-30k=/tmp/exp/D_docs.npy"
