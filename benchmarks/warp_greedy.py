# Experiment (attention_warp.glsl): the demo model's greedy run with every decode and prompt row's logits, saved to argv[1]; run in a tree whose spv/ holds the build under test.
import os, sys, numpy as np
sys.path.insert(0, '.')
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.engine.generate import generate_greedy
from tests.step_logits import keep_logits
rng = np.random.default_rng(0)
cfg = Gemma3Config.from_dir(DEMO_MODEL)
lens = tuple(int(x) for x in os.environ.get("LENS", "37,150,5,300,64,90,17,200").split(","))
prompts = [[int(t) for t in rng.integers(3, cfg.vocab_size, n)] for n in lens]
b = VulkanBackend(cfg, kv_dtype=os.environ.get("KV", "fp16"))
b.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
rows = {}
out = generate_greedy(b, prompts, int(os.environ.get("NEW", "32")), step_token_budget=4096,
                      on_step=lambda ids, batch, result: keep_logits(rows, ids, batch, result))
b.close()
np.save(sys.argv[1], {"rows": rows, "out": out, "lens": lens}, allow_pickle=True)
