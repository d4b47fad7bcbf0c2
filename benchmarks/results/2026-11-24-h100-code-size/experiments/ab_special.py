"""The committed decode attention with its sizes specialised in (graph.py, kernels.SPECIALIZED)
against the same tree with `specialize` ignored: the driver's binary size and registers of both
pipelines, the logits hashes (must agree), then the median 4b decode step at batch 1 and 32,
alternating, three rounds (builds.alternate_settings).

    python3 ab_special.py"""
from builds import Kmod, alternate_settings, print_stats, shape_config

NAME = "attention_float16_split_qk"
RECORD = Kmod.Kernels.record


def plain_record(self, cb, name, dset, push, indirect, offset, specialize=False):
    RECORD(self, cb, name, dset, push, indirect, offset, False)


def use(record):
    return lambda backend: setattr(Kmod.Kernels, "record", record)


if __name__ == "__main__":
    cfg = shape_config("4b")
    special = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, 16, 64, 8)  # the bench's block size and chunk, qkv's chunks
    print_stats([("plain", NAME, None, ()), ("specialised", NAME, None, special)])
    alternate_settings([("specialised", use(RECORD)), ("plain", use(plain_record))])
