cd /tmp/exp && . /work/main/.venv/bin/activate
while kill -0 27854 2>/dev/null; do sleep 5; done
run() { echo "### $(date -Is) $*"; /usr/bin/time -f "[wall %es, maxrss %MkB]" "$@" 2>&1; }
run python diaglib.py /tmp/exp/calib_docs_2k.txt /tmp/exp/D_docs_2k.npy
run python rtn_diag.py "unweighted(no calib)=none" "docs-2k=/tmp/exp/D_docs_2k.npy"
run python diaglib.py /tmp/exp/calib_self2.txt /tmp/exp/D_self2.npy
run python rtn_diag.py "self-24k(thread-safe)=/tmp/exp/D_self.npy,/tmp/exp/D_self2.npy" "docs-8k+self-7k=/tmp/exp/D_docs_8k.npy,/tmp/exp/D_self.npy"
