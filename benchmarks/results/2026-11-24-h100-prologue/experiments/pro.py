"""The reduces of a decode step run as prologues of the matmuls after them (matmul_coop_pro.comp),
at 4b in steps of 1 or 2 tokens: 5 dispatches a layer instead of 8. Logits bits against the
shipped recording, registers, the median decode step (builds alternating) and a profile.
usage: pro.py [--stats] [--quick] [BUILDS]   BUILDS: comma-separated of nowf,wf,skip,loads
(default nowf,wf); --quick: two rounds at batch 1"""
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "2026-11-24-h100-attention" / "experiments"))
from common import backend_4b, file_variant, logits_hashes, median_step, warm  # noqa: E402
from gemma_batch.backends.vulkan import graph as G  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402
from gemma_batch.backends.vulkan import step_buffers as SB  # noqa: E402
from gemma_batch.backends.vulkan.coop_tiles import coop_chunks, coop_cols, coop_fold_rows  # noqa: E402

STATE = {"on": False}
ROUNDS, BATCHES = 3, (1, 2)
NAMES = ("coop_pro_norm", "coop_gated_pro_norm", "coop_pro_gated")
FILES = {"nowf": ("pro_norm.spv", "pro_gated_norm.spv", "pro_gated_in.spv"),
         "wf": ("pro_norm_wf.spv", "pro_gated_norm_wf.spv", "pro_gated_in_wf.spv"),
         # timing only (wrong results): no prologue; the chunk sums' loads and sums only
         "skip": ("pro_norm_skip.spv", "pro_gated_norm_skip.spv", "pro_gated_in_skip.spv"),
         "loads": ("pro_norm_loads.spv", "pro_gated_norm_loads.spv", "pro_gated_in_loads.spv"),
         # x's fragments straight from shared memory (batch 1 only): no prologue (wrong results); the full prologue
         "dskip": ("pro_norm_dskip.spv", "pro_gated_norm_dskip.spv", "pro_gated_in_dskip.spv"),
         "d": ("pro_norm_d.spv", "pro_gated_norm_d.spv", "pro_gated_in_d.spv")}


def use(build: str) -> None:
    for name, spv in zip(NAMES, FILES[build]):
        Kmod.VARIANTS[name] = file_variant(name, "matmul_coop_direct", HERE / spv)  # (variants.VARIANTS, the same dict)


# the extra step buffers: a second partial sums, residual and scale buffer
orig_init, orig_all = SB.StepBuffers.__init__, SB.StepBuffers.all


def init(self, cfg, memory, capacity, *a, **k):
    orig_init(self, cfg, memory, capacity, *a, **k)
    self.partial2 = memory.alloc(self.partial.size, "partial sums 2")
    self.x2 = memory.alloc(self.x.size, "residual 2")
    self.scale2 = memory.alloc(self.split_scale.size, "scales 2")


SB.StepBuffers.__init__ = init
SB.StepBuffers.all = lambda self: orig_all(self) + [self.partial2, self.x2, self.scale2]
orig_record = G.StepGraph._record


def pro_matmul(self, name, layer, key, N, K, prev, prev_chunks, sin, sout, out, extra):
    dtype = self.w.dtype(layer, key)
    gated = key == "gate_proj"
    cols = 2 * N if gated else N
    chunks = coop_chunks(cols, K, self.plan.coop_min_chunk)
    tiles = -(-cols // coop_cols(dtype, False))
    weights = {0: self.w.buffer(layer, key), **({4: self.w.buffer(layer, "up_proj")} if gated else {})}
    self._dispatch(name, {**weights, 2: out, 3: prev, 5: sin, 6: sout, **extra},
                   {"N": cols, "K": K, "kchunk": K // chunks, "group": prev_chunks, "fold_rows": 0},
                   (f"coop_tokens {chunks}", tiles))


def record(self):
    if not (STATE["on"] and self.mode == "decode"):
        return orig_record(self)
    cfg, b, inp, w = self.cfg, self.b, self.inp, self.w
    H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    minc = self.plan.coop_min_chunk
    qkv_n = cfg.q_width + 2 * cfg.kv_width
    ch = {"qkv": coop_chunks(qkv_n, H, minc), "o": coop_chunks(H, cfg.q_width, minc),
          "gate": coop_chunks(2 * I, H, minc), "down": coop_chunks(H, I, minc)}
    self.kernels.begin_step(self.cb)
    self.stamps.reset(self.cb)
    self.stamps.write(self.cb, 0)
    self.kernels.zero(self.cb, [b.counters, b.attn_counters, b.row_sync])
    self._dispatch(f"embed_{w.dtype(-1, 'embed').lower()}", {0: w.buffer(-1, "embed"), 1: inp.tokens, 2: b.x, 3: self.prev_ids},
                   {"H": H, "scale": cfg.embed_scale, "V": cfg.vocab_size}, ("tokens", 1))
    groups = {layer: g for g in cfg.kv_groups() for layer in g.layers}
    P, S, X = [b.partial, b.partial2], [b.split_scale, b.scale2], [b.x, b.x2]
    p = s = x = 0
    partial0 = b.partial
    for layer in range(L):
        lw, group = w.layers[layer], groups[layer]
        fuse = self.plan.layer(layer)
        assert fuse.split_o and fuse.split_gate and fuse.split_down and fuse.heads_in_attention
        qk = {9: lw["qk_norm"], 10: b.q, 11: inp.positions, 12: self.inv_freq[group.name], 13: inp.slots[group.name],
              14: self.k_pages[layer], 15: self.v_pages[layer]}
        if layer == 0:  # split of the embedding, qkv into P[0], its scale in S[0]
            self._matmul(f"norm_qk_rope_{self.kv_name}", layer, "qkv", b.x, b.qkv, qkv_n, H, lw["input_layernorm"], qk,
                         presplit=False, reduce_chunks=False)
        else:  # down's reduce as qkv's prologue
            pro_matmul(self, "coop_pro_norm", layer, "qkv", qkv_n, H, P[p], ch["down"], S[s], S[1 - s], P[1 - p],
                       {8: X[x], 9: X[1 - x], 10: w.layers[layer - 1]["post_feedforward_layernorm"], 11: lw["input_layernorm"]})
            p, s, x = 1 - p, 1 - s, 1 - x
        width = dict(b.capacity.widths)[group.name]
        self._dispatch(f"attention_{self.kv_name}_split_qk",
                       {0: P[p], 13: lw["qk_norm"], 14: self.inv_freq[group.name], 15: inp.slots[group.name],
                        1: b.attn, 2: inp.positions, 3: inp.token_seq, 4: inp.tables[group.name],
                        5: b.part_acc, 6: self.k_pages[layer], 8: self.v_pages[layer], 9: b.part_ml,
                        10: b.attn_counters, 11: b.split, 12: S[s]},
                       {"num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                        "window": group.window or 0, "block_size": self.block_size, "table_stride": width,
                        "chunk": self.attention_chunk, "scale": cfg.attn_scale, "qkv_chunks": ch["qkv"],
                        "eps": cfg.rms_norm_eps},
                       (f"attention {group.name}", cfg.num_kv_heads), specialize=True)
        b.partial = P[1 - p]  # o: attention wrote its split and its scale (S[s])
        self._coop_matmul("post_norm", layer, "o_proj", w.dtype(layer, "o_proj"), b.attn, b.y, H, cfg.q_width, None,
                          None, True, None, False)
        b.partial = partial0
        p = 1 - p
        pro_matmul(self, "coop_gated_pro_norm", layer, "gate_proj", I, H, P[p], ch["o"], S[s], S[1 - s], P[1 - p],
                   {8: X[x], 9: X[1 - x], 10: lw["post_attention_layernorm"], 11: lw["pre_feedforward_layernorm"]})
        p, s, x = 1 - p, 1 - s, 1 - x
        pro_matmul(self, "coop_pro_gated", layer, "down_proj", H, I, P[p], ch["gate"], S[s], S[1 - s], P[1 - p], {})
        p, s = 1 - p, 1 - s
    fold_rows = coop_fold_rows(-(-H // coop_cols(w.dtype(L - 1, "down_proj"), False)), ch["down"],
                               self.kernels.dev.info.sm_count)
    self._dispatch("reduce_post_norm", {0: P[p], 2: b.y, 4: S[s], 9: w.layers[L - 1]["post_feedforward_layernorm"], 10: X[x]},
                   {"N": H, "chunks": ch["down"], "fold_rows": fold_rows, "eps": cfg.rms_norm_eps,
                    "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim}, ("tokens", 1))
    self._matmul("norm_rows", -1, "lm_head", X[x], b.logits, cfg.vocab_size, H, w.buffer(-1, "norm"), {5: inp.rows})
    self._dispatch("sample", {0: b.logits, 1: inp.params, 2: inp.ids}, {"row_stride": cfg.vocab_size}, ("rows", 1))
    if not self.profile:
        self._stamp("step")
    self.kernels.end_step(self.cb)


G.StepGraph._record = record


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    builds = args[0].split(",") if args else ["nowf", "wf"]
    global ROUNDS, BATCHES
    if "--quick" in sys.argv:  # two rounds at batch 1
        ROUNDS, BATCHES = 2, (1,)
    if "--stats" in sys.argv:
        sys.argv = ["kernel_stats", "4b", "--kernels", "coop_t16,coop_gated_t16," + ",".join(NAMES)]
        import runpy
        for b in builds:
            use(b)
            print(f"build {b}:", flush=True)
            runpy.run_path(str(HERE.parents[3] / "benchmarks" / "kernel_stats.py"), run_name="__main__")
        return
    t0 = time.time()
    backend = backend_4b()
    print(f"loaded 4b in {time.time() - t0:.0f} s", flush=True)

    def setting(label):
        STATE["on"] = label != "shipped"
        if label != "shipped":
            use(label)
            for name in NAMES:
                backend.kernels.pipelines.pop(name, None)
        backend._drop_graph()

    labels = ["shipped", *builds]
    ref = {}
    for label in labels:
        if label in ("skip", "loads", "dskip"):
            continue
        setting(label)
        for batch in ((1,) if label in ("d", "dskip") or "--quick" in sys.argv else (1, 2)):
            h = logits_hashes(backend, batch)
            verdict = "reference" if batch not in ref else ("IDENTICAL" if h == ref[batch] else "DIFFERENT")
            ref.setdefault(batch, h)
            print(f"{label} b{batch}: logits {verdict} {h[:3]}", flush=True)
    for _ in range(ROUNDS):
        for label in labels:
            setting(label)
            for batch in BATCHES:
                warm(backend, batch)
                print(f"{label} 4b b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)
    backend.profile = True
    for label in labels:
        setting(label)
        warm(backend, 1)
        median_step(backend, 1, 8)
        prof = backend.profile_seconds()
        top = sorted(prof.items(), key=lambda kv: -kv[1])
        print(f"{label} b1 profile: total {sum(prof.values()) * 1e6:.0f} us; "
              + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in top[:12]), flush=True)


if __name__ == "__main__":
    main()
