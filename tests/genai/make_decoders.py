"""Small decoder-only language models of real architectures, made here: no model hub (issue 24).

Each model is a ``transformers`` architecture (Llama, Qwen2, Phi-3, Gemma, Gemma 2) built from its
config class with random weights (fixed seed), saved with ``save_pretrained`` next to a byte-level
BPE tokenizer trained with ``tokenizers`` on the repository's own docs (docs/*.md), and then turned
into what users deploy:

* ``<arch>-fp32`` / ``<arch>-int4``: onnxruntime-genai's model builder
  (``python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32|int4 -e cpu``): its
  GroupQueryAttention / MatMulNBits / RotaryEmbedding graph and genai_config.json;
* ``<arch>-torch``: ``torch.onnx.export`` of the model with its KV cache as inputs and outputs
  (``past_key_values.{i}.key|value`` -> ``present.{i}.key|value``, plain ONNX ops, the cache grows by
  Concat) plus the genai_config.json that onnxruntime-genai reads for such a model.

The tests (tests/genai/conftest.py) and the benchmark (benchmarks/genai.py) call :func:`make` (it
runs everything heavy in one child process: transformers and torch are imported there, never in the
caller).  As a script::

    python tests/genai/make_decoders.py OUT_DIR --arch llama,qwen2 --size tiny --fp32 --int4 --torch

Everything is cached in OUT_DIR: a model whose folder is complete (a ``.done`` marker holding the
recipe) is not made again; a changed recipe (size, seed, this file's version) makes it again.

The child process hides torchvision from transformers: the CPU torch wheel this project pins cannot
load the PyPI torchvision wheel's C ops, and transformers imports torchvision when it is installed.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RECIPE_VERSION = 5  # bump when a change here changes the models made

# Model sizes.  "tiny": for the tests (hidden 64, 2 layers: a few hundred thousand parameters, a
# 512-token vocabulary); "bench": for benchmarks/genai.py (~30M parameters, 4096-token vocabulary).
SIZES = {
    "tiny": dict(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, context=512),
    "small": dict(vocab=2048, hidden=256, layers=4, heads=8, kv_heads=4, intermediate=768, context=1024),
    "bench": dict(vocab=4096, hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, context=2048),
}
ARCHS = ("llama", "qwen2", "phi3", "gemma", "gemma2")
# What :func:`make` makes of each architecture: onnxruntime-genai's builder at fp32 / int4 (every
# layer a full-length KV cache: windowed_kv_cache=false), the builder's defaults at fp32
# ("fp32-windowed": Gemma 2's windowed cache), torch's exporter.
KINDS = ("fp32", "int4", "fp32-windowed", "torch")
# Special tokens of the trained tokenizer: ids 0.. in this order.
SPECIAL = ["<|endoftext|>", "<|bos|>", "<|user|>", "<|assistant|>", "<|end|>"]
EOS_ID, BOS_ID = 0, 1
# A minimal chat template (the tokenizer_config.json "chat_template" of the models made here).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _hf_config(arch: str, size: str, seed_scale: float):
    """The transformers config of a model of ``arch`` at ``size``."""
    import transformers as tf

    s = SIZES[size]
    head = s["hidden"] // s["heads"]
    common = dict(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        max_position_embeddings=s["context"], bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID,
        initializer_range=seed_scale, tie_word_embeddings=False,
    )
    if arch == "llama":
        return tf.LlamaConfig(**common)
    if arch == "qwen2":  # q/k/v projections with bias
        return tf.Qwen2Config(**common, use_sliding_window=False)
    if arch == "phi3":  # fused qkv and gate_up projections
        return tf.Phi3Config(**common, original_max_position_embeddings=s["context"])
    if arch == "gemma":  # GeLU (tanh) MLP, embeddings scaled by sqrt(hidden), (1 + w) RMS norm weights
        return tf.GemmaConfig(**common, head_dim=head, hidden_activation="gelu_pytorch_tanh")
    if arch == "gemma2":  # + attention and final logit soft-capping, sliding-window (local) layers
        return tf.Gemma2Config(**common, head_dim=head, hidden_activation="gelu_pytorch_tanh",
                               query_pre_attn_scalar=head, sliding_window=min(64, s["context"] // 4),
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")


def _training_text() -> list[str]:
    """The text the tokenizer learns from: the repository's documentation (no download)."""
    paths = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
    texts = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            texts.append(f.read())
    if not texts:
        raise RuntimeError(f"no text to train a tokenizer on under {ROOT}/docs")
    return texts


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2 style: every byte is a token, so any text encodes) of
    ``vocab_size`` tokens, the special tokens first, trained on the repository's docs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_training_text(), trainer)
    # (no post-processor adding a BOS: onnxruntime-genai's tokenizer ignores tokenizer.json's post-processor
    # for a tokenizer of this class, and the tests compare both tokenizers' ids)
    return tok


def _save_tokenizer(tok, out_dir: str) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[BOS_ID], eos_token=SPECIAL[EOS_ID],
                                   pad_token=SPECIAL[EOS_ID], additional_special_tokens=SPECIAL[2:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    # the chat template also inside tokenizer_config.json (older transformers' place, where
    # onnxruntime-genai and minirt.genai look first)
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)


def make_hf(arch: str, size: str, out_dir: str, seed: int = 0) -> None:
    """The transformers model (random weights from ``seed``) and its tokenizer in ``out_dir``."""
    import torch
    import transformers as tf

    tok = train_tokenizer(SIZES[size]["vocab"])
    if tok.get_vocab_size() != SIZES[size]["vocab"]:
        raise RuntimeError(f"the tokenizer learned {tok.get_vocab_size()} tokens, not {SIZES[size]['vocab']}: "
                           f"too little text under docs/")
    # A wider initialisation than transformers' 0.02: the logits of a random 2-layer model are then
    # spread enough that greedy decoding meets no near-ties that float rounding could flip.
    cfg = _hf_config(arch, size, seed_scale=0.1 if size == "tiny" else 0.05)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # biases are initialised to zero (which the converters may drop): make them count
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, cfg.initializer_range)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    _save_tokenizer(tok, out_dir)


def convert_genai(hf_dir: str, out_dir: str, precision: str, cache_dir: str, windowed: bool = False) -> None:
    """onnxruntime-genai's model builder, in this process (the child's), for the CPU.

    ``windowed``: the builder's default ``windowed_kv_cache=true``, which gives Gemma 2's
    sliding-window layers GroupQueryAttention's ``sliding_window_cache=1`` (a cache of their own
    layout, not supported by minirt's kernel); False (``windowed_kv_cache=false``, what the tests
    use): every layer a full-length cache, the window applied by ``local_window_size``.  The option
    changes nothing for architectures without sliding-window layers."""
    from onnxruntime_genai.models import builder as gb

    options = ["hf_token=false"] + ([] if windowed else ["windowed_kv_cache=false"])
    extra = gb.parse_extra_options(None, hf_dir, out_dir, precision, "cpu", cache_dir, options)
    gb.create_model(None, hf_dir, out_dir, precision, "cpu", cache_dir, **extra)


def export_torch(hf_dir: str, out_dir: str) -> None:
    """``torch.onnx.export`` (TorchScript exporter) of the model with its KV cache as inputs and
    outputs, plus tokenizer files and a genai_config.json (past_present_share_buffer false)."""
    import warnings

    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    cfg = model.config
    n_layers = cfg.num_hidden_layers
    kvh = cfg.num_key_value_heads
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    class WithCache(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = tf.DynamicCache(config=self.m.config)
            for i in range(n_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
            res = [out.logits]
            for layer in out.past_key_values.layers[:n_layers]:
                res += [layer.keys, layer.values]
            return tuple(res)

    b, p, s = 1, 3, 2
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    mask = torch.ones(b, p + s, dtype=torch.int64)
    pos = torch.arange(p, p + s)[None]
    past = [torch.randn(b, kvh, p, head) for _ in range(2 * n_layers)]
    kv = [f"{i}.{w}" for i in range(n_layers) for w in ("key", "value")]
    names_in = ["input_ids", "attention_mask", "position_ids"] + [f"past_key_values.{n}" for n in kv]
    names_out = ["logits"] + [f"present.{n}" for n in kv]
    dyn = {"input_ids": {0: "batch_size", 1: "sequence_length"},
           "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
           "position_ids": {0: "batch_size", 1: "sequence_length"},
           "logits": {0: "batch_size", 1: "sequence_length"}}
    dyn.update({n: {0: "batch_size", 2: "past_sequence_length"} for n in names_in[3:]})
    dyn.update({n: {0: "batch_size", 2: "total_sequence_length"} for n in names_out[1:]})
    os.makedirs(out_dir, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(WithCache(model), (ids, mask, pos, *past), os.path.join(out_dir, "model.onnx"),
                          dynamo=False, input_names=names_in, output_names=names_out, dynamic_axes=dyn,
                          opset_version=17)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(hf_dir, name)):
            shutil.copy(os.path.join(hf_dir, name), out_dir)
    genai = {
        "model": {
            "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID,
            "context_length": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
            "type": cfg.model_type,
            "decoder": {
                "filename": "model.onnx", "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "head_size": head, "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
                "num_hidden_layers": n_layers, "num_key_value_heads": kvh,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"do_sample": False, "max_length": cfg.max_position_embeddings, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": False, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 50, "top_p": 1.0},
    }
    with open(os.path.join(out_dir, "genai_config.json"), "w", encoding="utf-8") as f:
        json.dump(genai, f, indent=4)


def _recipe(arch: str, size: str, seed: int, what: str) -> dict:
    return {"arch": arch, "size": size, "seed": seed, "what": what, "version": RECIPE_VERSION}


def _done(folder: str, recipe: dict) -> bool:
    try:
        with open(os.path.join(folder, ".done"), encoding="utf-8") as f:
            return json.load(f) == recipe
    except (OSError, ValueError):
        return False


def _mark(folder: str, recipe: dict) -> None:
    with open(os.path.join(folder, ".done"), "w", encoding="utf-8") as f:
        json.dump(recipe, f)


def folder(cache: str, arch: str, what: str, size: str = "tiny") -> str:
    """Where :func:`make` puts ``arch``'s ``what`` ("hf" or one of :data:`KINDS`)."""
    return os.path.join(cache, f"{arch}-{size}-{what}")


def _make_here(cache: str, archs, size: str, whats, seed: int, log) -> None:
    """Make what is missing, in this process (the child's)."""
    for arch in archs:
        hf = folder(cache, arch, "hf", size)
        rec = _recipe(arch, size, seed, "hf")
        if not _done(hf, rec):
            t = time.perf_counter()
            shutil.rmtree(hf, ignore_errors=True)
            make_hf(arch, size, hf, seed)
            _mark(hf, rec)
            log(f"{arch}: transformers model in {time.perf_counter() - t:.1f} s")
        for what in whats:
            out = folder(cache, arch, what, size)
            rec = _recipe(arch, size, seed, what)
            if _done(out, rec):
                continue
            t = time.perf_counter()
            shutil.rmtree(out, ignore_errors=True)
            if what == "torch":
                export_torch(hf, out)
            else:
                convert_genai(hf, out, what.split("-")[0], os.path.join(cache, ".hf-cache"),
                              windowed=what.endswith("-windowed"))
            _mark(out, rec)
            log(f"{arch}: {what} in {time.perf_counter() - t:.1f} s")


def make(cache: str, archs=("llama",), whats=("fp32",), size: str = "tiny", seed: int = 0,
         timeout: float = 900, quiet: bool = True) -> dict:
    """Make (or find in ``cache``) each architecture's models; returns {(arch, what): folder}.

    Runs in a child process (transformers, torch and onnxruntime-genai's builder are imported there
    only).  ``whats``: any of :data:`KINDS`.
    Raises RuntimeError with the child's output when it fails."""
    archs, whats = list(archs), list(whats)
    for a in archs:
        if a not in ARCHS:
            raise ValueError(f"unknown architecture {a!r}; known: {', '.join(ARCHS)}")
    for w in whats:
        if w not in KINDS:
            raise ValueError(f"unknown model kind {w!r}: one of {', '.join(KINDS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    want = {(a, w): folder(cache, a, w, size) for a in archs for w in whats}
    missing = [a for a in archs if not _done(folder(cache, a, "hf", size), _recipe(a, size, seed, "hf"))
               or any(not _done(want[(a, w)], _recipe(a, size, seed, w)) for w in whats)]
    if missing:
        os.makedirs(cache, exist_ok=True)
        cmd = [sys.executable, os.path.abspath(__file__), cache, "--arch", ",".join(missing), "--size", size,
               "--seed", str(seed)] + [f"--{w}" for w in whats]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"making decoders failed ({' '.join(cmd)}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
        if not quiet:
            print(proc.stdout, end="")
    return want


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache", help="output folder (also the cache)")
    ap.add_argument("--arch", default="llama", help=f"comma-separated, of {', '.join(ARCHS)} (or 'all')")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fp32", action="store_true", help="onnxruntime-genai builder, fp32")
    ap.add_argument("--int4", action="store_true", help="onnxruntime-genai builder, int4 (MatMulNBits)")
    ap.add_argument("--fp32-windowed", action="store_true", help="onnxruntime-genai builder, fp32, its default "
                                                                   "windowed KV cache (Gemma 2)")
    ap.add_argument("--torch", action="store_true", help="torch.onnx.export with past_key_values")
    args = ap.parse_args(argv)
    archs = list(ARCHS) if args.arch == "all" else [a for a in args.arch.split(",") if a]
    whats = [w for w in KINDS if getattr(args, w.replace("-", "_"))]
    # transformers imports torchvision when it is installed; the PyPI torchvision wheel's C ops do not
    # load with the CPU torch wheel pinned here, and nothing here needs torchvision: hide it
    sys.modules["torchvision"] = None  # type: ignore[assignment]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("onnxruntime_genai").setLevel(logging.ERROR)
    _make_here(args.cache, archs, args.size, whats, args.seed, lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
