"""Steps of more than 8 tokens (the "small" recording: attention_float16_split, not specialised)
with some of attention's sizes specialised in: which of them, if any, pays at batch 16 and 32.
Each build masks the SPECIALIZED values (head_dim, num_heads, num_kv_heads, block_size, chunk,
qkv_chunks; 0 = left to the push constants): binary size and registers, logits hashes (must
agree), then the median 4b decode step, alternating, three rounds.

    python3 subset.py"""
from builds import Kmod, alternate_settings, print_stats, shape_config

TARGET = "attention_float16_split"
MASKS = {"none": None, "all": (1, 1, 1, 1, 1, 1), "all but head_dim": (0, 1, 1, 1, 1, 1),
         "heads, block size, chunk": (0, 1, 1, 1, 1, 0), "block size, chunk": (0, 0, 0, 1, 1, 0)}
BIND, PIPELINE = Kmod.Kernels._bind, Kmod.Kernels.pipeline
mask = [None]


def bind(self, cb, name, dset, push, specialize):
    BIND(self, cb, name, dset, push, specialize or (name == TARGET and mask[0] is not None))


def pipeline(self, name, special=()):
    if name == TARGET and special:
        special = tuple(v if m else 0 for v, m in zip(special, mask[0]))
    return PIPELINE(self, name, special)


if __name__ == "__main__":
    cfg = shape_config("4b")
    values = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, 16, 64, 0)
    print_stats([(label, TARGET, None, tuple(v if k else 0 for v, k in zip(values, m)) if m else ())
                 for label, m in MASKS.items()])
    Kmod.Kernels._bind, Kmod.Kernels.pipeline = bind, pipeline
    alternate_settings([(label, lambda backend, m=m: mask.__setitem__(0, m)) for label, m in MASKS.items()], batches=(16, 32))
