cd /tmp/exp && . /work/main/.venv/bin/activate
run() { echo "### $(date -Is) $*"; /usr/bin/time -f "[wall %es, maxrss %MkB]" "$@" 2>&1; }
run python diaglib.py /tmp/exp/calib8k.txt /tmp/exp/D_calib8k.npy
run python rtn_diag.py "calib8k(docs first 32000 chars, 10.9k tok)=/tmp/exp/D_calib8k.npy" "docs-30k+self-24k=/tmp/exp/D_docs.npy,/tmp/exp/D_self.npy,/tmp/exp/D_self2.npy"
