# Experiment (attention_warp.glsl): warp_greedy.py on a tiny random model of head_dim 32 (two keys side by side in a subgroup of 8 on llvmpipe).
import os, sys, numpy as np
sys.path.insert(0, '.')
from pathlib import Path
from tests.tiny_models import make_causal_lm
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.engine.generate import generate_greedy
from tests.step_logits import keep_logits
d = Path("/tmp/wk/tinyhd32")
if not d.exists():
    make_causal_lm(d, head_dim=32, num_attention_heads=8, num_key_value_heads=2, sliding_window=40, max_position_embeddings=1024)
cfg = Gemma3Config.from_dir(d)
rng = np.random.default_rng(0)
lens = (37, 150, 5, 300, 64, 90, 17, 200)
prompts = [[int(t) for t in rng.integers(3, cfg.vocab_size, n)] for n in lens]
b = VulkanBackend(cfg, kv_dtype="fp16")
b.load_weights(Checkpoint.open(d, cfg).tensors())
rows = {}
out = generate_greedy(b, prompts, 32, step_token_budget=4096, on_step=lambda ids, batch, result: keep_logits(rows, ids, batch, result))
b.close()
np.save(sys.argv[1], {"rows": rows, "out": out, "lens": lens}, allow_pickle=True)
