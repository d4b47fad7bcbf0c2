"""The decode attention with its multi-chunk path first and one call of split_when_last
(`after_*.spv`: shaders/ at `219ce19` with one_exit.diff applied, built by shaders/build.py)
against the build before (`before_*.spv`, `219ce19`'s spv/): driver binary size, logits hashes
(must agree), median 4b decode step at batch 1 and 32, alternating, three rounds. Both are
specialised as the graph records them.

    python3 one_exit.py"""
from builds import HERE, alternate_settings, from_files, print_stats, shape_config

NAME = "attention_float16_split_qk"


if __name__ == "__main__":
    cfg = shape_config("4b")
    special = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, 16, 64, 8)
    print_stats([(label, NAME, HERE / f"spv/{label}_{NAME}.spv", special) for label in ("before", "after")])
    alternate_settings([(label, from_files({NAME: HERE / f"spv/{spv}_{NAME}.spv"}))
                        for label, spv in (("before", "before"), ("one exit", "after"))])
