"""Token counts of calibration texts, word 8-gram / long-substring overlap with the evaluation texts,
and cut-down calibration files (first N tokens, cut at a token boundary)."""
import re, sys
sys.path.insert(0, "/tmp/exp")
from qlib import V1
from gemma_batch.engine.llm import LLM

EVAL = {"apache": "/work/main/sample_data/apache-2.0.txt", "bible": "/tmp/exp/bible.txt"}
CAL = ["/tmp/exp/calib_docs.txt", "/tmp/exp/calib8k.txt", "/tmp/exp/calib_self.txt", "/tmp/exp/calib_self2.txt", "/tmp/exp/calib_self3.txt"]
llm = LLM(V1, backend="cpu"); tok = llm.tokenizer

def words(s): return re.findall(r"[a-z0-9]+", s.lower())
def grams(s, n=8):
    w = words(s); return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}
ev = {k: open(p).read() for k, p in EVAL.items()}
evg = {k: grams(v) for k, v in ev.items()}
for k, v in ev.items(): print(f"eval {k}: {len(tok.encode(v, add_bos=False))} tokens")

def report(p, text):
    ids = tok.encode(text, add_bos=False)
    ov = {k: len(grams(text) & g) for k, g in evg.items()}
    print(f"{p}: {len(text)} chars, {len(ids)} tokens, shared word 8-grams: " + ", ".join(f"{k} {n}" for k, n in ov.items()))
    for k, g in evg.items():
        shared = grams(text) & g
        for s in list(shared)[:5]: print("   ", k, " ".join(s))
    return ids

for p in CAL: report(p, open(p).read())

# cut-downs: first ~N tokens of a text, decoded back from whole tokens at a line end where possible
def cut(src, n, dst):
    text = open(src).read(); ids = tok.encode(text, add_bos=False)
    t = tok.decode(ids[:n])
    i = t.rfind("\n")
    if i > len(t) * 0.9: t = t[:i + 1]
    assert text.startswith(t), "decoded prefix differs from the file"
    open(dst, "w").write(t)
    report(dst, t)
cut("/tmp/exp/calib_self.txt", 2000, "/tmp/exp/calib_self_2k.txt")
cut("/tmp/exp/calib_docs.txt", 8000, "/tmp/exp/calib_docs_8k.txt")
cut("/tmp/exp/calib_docs.txt", 2000, "/tmp/exp/calib_docs_2k.txt")
llm.backend.close()
