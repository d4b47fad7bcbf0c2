"""The push constants of each shader source, as numpy dtypes (the GLSL `Push` blocks' other side;
`tests/test_vulkan_shaders.py` checks that the two agree), and which of them a pipeline may also
take as specialization constants.
"""

from __future__ import annotations

import numpy as np

PUSH_BYTES = 40  # the pipeline layout's push-constant range (Vulkan guarantees 128)

_u, _f = np.uint32, np.float32
_COOP_PUSH = np.dtype([("N", _u), ("K", _u), ("kchunk", _u), ("group", _u), ("fold_rows", _u)])
PUSH = {
    "embed": np.dtype([("H", _u), ("scale", _f), ("V", _u)]),
    "matmul": np.dtype([("N", _u), ("K", _u), ("eps", _f), ("num_heads", _u), ("num_kv_heads", _u), ("head_dim", _u),
                        ("group", _u)]),
    "attention": np.dtype([
        ("num_heads", _u), ("num_kv_heads", _u), ("head_dim", _u), ("window", _u),
        ("block_size", _u), ("table_stride", _u), ("chunk", _u), ("scale", _f), ("qkv_chunks", _u), ("eps", _f),
    ]),
    "attention_flash": np.dtype([
        ("num_heads", _u), ("num_kv_heads", _u), ("head_dim", _u), ("window", _u),
        ("block_size", _u), ("table_stride", _u), ("scale", _f),
    ]),
    "sample": np.dtype([("row_stride", _u)]),
    "row_scores": np.dtype([("row_stride", _u)]),
    "read_bandwidth": np.dtype([("n", _u), ("iterations", _u)]),
    "coop_fragment_probe": np.dtype([("words", _u)]),
    "tiles": np.dtype([("words", _u), ("K", _u), ("dst_word", _u), ("fragment", _u), ("bf16", _u)]),
    "matmul_coop": _COOP_PUSH,
    "matmul_coop_direct": _COOP_PUSH,  # the same layout: the graph dispatches either with one push
    "split": np.dtype([("K", _u), ("eps", _f)]),
    "reduce": np.dtype([("N", _u), ("chunks", _u), ("fold_rows", _u), ("eps", _f), ("num_heads", _u), ("num_kv_heads", _u),
                        ("head_dim", _u)]),
}

# Push constants that a pipeline may also take as specialization constants, in this order after
# Kernels.constants (7, 8, ...), by source: `Kernels.record(..., specialize=True)` builds one
# pipeline per distinct set of their values (attention.comp: the decode variant, graph.py), and
# the compiler folds them
# (attention_flash.comp: always, its register arrays are sized by them).
SPECIALIZED = {"attention": ("head_dim", "num_heads", "num_kv_heads", "block_size", "chunk", "qkv_chunks"),
               "attention_flash": ("head_dim", "num_heads", "num_kv_heads")}
