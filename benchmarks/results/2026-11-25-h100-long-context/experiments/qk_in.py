"""`gemma-batch bench` with attention's QK_IN route on (as shipped) or off: `off` sets
graph.QK_IN_MAX_TOKENS to 0, so decode steps replay the "small" recording, where qkv's reduce
(reduce_qk_rope) makes the heads once per token and attention reads them, instead of every
attention workgroup (each chunk of each token and kv head) summing qkv's K chunks itself. The two
routes give the same bits (graph.py switches between them by step size). Timing only.

    python3 qk_in.py on|off --shape 4b --batch 1,32 --prompt-len 2048 --gen-len 64 --backend vulkan
"""

import sys

from gemma_batch.backends.vulkan import graph
from gemma_batch.cli import app

if sys.argv[1] == "off":
    graph.QK_IN_MAX_TOKENS = 0
sys.argv = ["gemma-batch", "bench", *sys.argv[2:]]
app()
