"""`gemma-batch perplexity`: windows cut as documented, log-probabilities equal to transformers' on
the same windows, the comparison's KL worked out by hand, and bad input refused (exit 2).

Tolerance: per-token log-probabilities within 1e-4 of transformers in float32 on the demo
model's bf16 weights (test_quality's reference tolerance; summation order only), so a perplexity
within 1e-4 relative.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import Gemma3ForCausalLM

from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.engine.perplexity import TokenScores, Window, compare, score_windows, text_windows
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.tokenizer import Tokenizer
from tests.test_run_job import gemma_batch

BOS = 2


def test_windows_cut_as_the_docstring_draws_them():
    ids = list(range(10, 20))
    assert text_windows(ids, BOS, 4, 4) == [Window([BOS, 10, 11, 12, 13], 0), Window([BOS, 14, 15, 16, 17], 0),
                                            Window([BOS, 18, 19], 0)]
    # stride 2: each window after the first scores only its last two tokens
    assert text_windows(ids[:7], BOS, 4, 2) == [Window([BOS, 10, 11, 12, 13], 0), Window([BOS, 12, 13, 14, 15], 2),
                                                Window([BOS, 14, 15, 16], 2)]
    assert text_windows(ids[:3], BOS, 8, 8) == [Window([BOS, 10, 11, 12], 0)]
    for context, stride in ((4, 5), (4, 0), (0, 1)):
        with pytest.raises(ValueError, match="stride"):
            text_windows(ids, BOS, context, stride)
    with pytest.raises(ValueError, match="no token"):
        text_windows([], BOS, 4, 4)


@pytest.fixture(scope="module")
def demo():
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    backend = CpuBackend(cfg)
    backend.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
    text = (DEMO_MODEL.parent / "kjv-heldout.txt").read_text(encoding="utf-8").splitlines()[0].split("\t", 1)[1]
    return backend, Tokenizer.from_dir(DEMO_MODEL).encode(text, add_bos=False)[:300]


@pytest.mark.parametrize("context, stride", [(100, 100), (100, 40)])
def test_scores_equal_transformers_on_the_same_windows(demo, context, stride):
    backend, ids = demo
    windows = text_windows(ids, BOS, context, stride)
    ours = score_windows(backend, windows, top_k=5, max_batch=2, step_tokens=64)
    model = Gemma3ForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
    theirs, top = [], []
    for w in windows:
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([w.ids])).logits[0].double(), -1)  # [len, V]
        for p in range(w.first_scored, len(w.ids) - 1):
            theirs.append(float(lp[p, w.ids[p + 1]]))
            top.append(int(lp[p].argmax()))
    assert ours.token_ids.tolist() == ids  # every token once, in text order
    assert np.abs(ours.logprobs - np.array(theirs)).max() < 1e-4
    assert ours.perplexity == pytest.approx(float(np.exp(-np.mean(theirs))), rel=1e-4)
    assert (ours.top_ids[:, 0] == np.array(top)).mean() > 0.99  # (a near tie may flip)
    assert np.all(np.diff(ours.top_logprobs, axis=1) <= 0)
    assert np.allclose(ours.top_logprobs[:, 0], np.max(ours.top_logprobs, axis=1))


def test_kl_over_the_top_k_and_the_rest_by_hand():
    """Reference p = (0.5, 0.3, 0.2) over 3 tokens, this run q = (0.4, 0.4, 0.2); the reference's
    top 2 are tokens 0 and 1, the rest bucket token 2: KL = sum p log(p/q) over the three (the
    bucket holds one token, so the coarse KL is the whole one)."""
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.4, 0.2])
    ref_ids = np.array([[0, 1]])
    run = TokenScores(np.array([2]), np.log(q[[2]]), np.array([[0, 1]]), np.log(q[[0, 1]])[None], np.log(q[[0, 1]])[None])
    c = compare(run, ref_ids, np.log(p[[0, 1]])[None], np.log(p[[2]]))
    assert c.mean_kl == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-12)
    assert c.top1_agreement == 1.0 and c.reference_perplexity == pytest.approx(1 / 0.2)


def test_the_command_compares_formats_and_refuses_bad_input(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text((DEMO_MODEL.parent / "kjv-heldout.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    base = ("perplexity", text, "--model", DEMO_MODEL, "--backend", "cpu", "--context", "64")
    done = gemma_batch(*base, "--json", tmp_path / "bf16.json")
    assert done.returncode == 0, done.stderr
    bf16 = json.loads((tmp_path / "bf16.json").read_text())
    assert bf16["weights"] == "bf16" and bf16["kv_dtype"] == "fp32" and bf16["tokens"] == len(bf16["token_ids"])
    assert bf16["perplexity"] == pytest.approx(float(np.exp(-np.mean(bf16["token_logprobs"]))), rel=1e-12)
    assert f"perplexity {bf16['perplexity']:.4f}" in done.stdout

    done = gemma_batch(*base, "--weights", "int4", "--reference", tmp_path / "bf16.json", "--json", tmp_path / "int4.json")
    assert done.returncode == 0, done.stderr
    ref = json.loads((tmp_path / "int4.json").read_text())["reference"]
    assert ref["perplexity"] == bf16["perplexity"] and ref["mean_kl"] > 1e-4 and 0.5 < ref["top1_agreement"] < 1
    same = gemma_batch(*base, "--reference", tmp_path / "bf16.json")  # itself: no divergence
    assert "change +0.00%, top-1 agreement 100.0%, mean KL 0.00000" in same.stdout, same.stderr

    for args, message in [((*base, "--stride", "65"), "--stride 65 is above --context 64"),
                          ((*base[:-1], "32", "--reference", tmp_path / "bf16.json"), "cut with --context 64 --stride 64"),
                          ((*base, "--weights", "int3"), "unknown weight format")]:
        done = gemma_batch(*args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    (tmp_path / "bad.json").write_text("{}")
    done = gemma_batch(*base, "--reference", tmp_path / "bad.json")
    assert done.returncode == 2 and "not a report of `gemma-batch perplexity --json`" in done.stderr
    done = gemma_batch("perplexity", tmp_path / "missing.txt", "--model", DEMO_MODEL)
    assert done.returncode == 2 and "missing.txt does not exist" in done.stderr
