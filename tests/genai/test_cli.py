"""``minirt generate`` and examples/raspberry_pi/chat.py on the locally made decoders."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import minirt.genai as mg
from minirt.cli import main
from tests.genai.conftest import generate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAT = os.path.join(ROOT, "examples", "raspberry_pi", "chat.py")
TEXT = "The builder checks an ONNX model"


def test_generate_streams_the_greedy_continuation(decoders, models, capsys):
    folder = decoders[("llama", "int4")]
    assert main(["generate", folder, "--prompt", TEXT, "--max-length", "40"]) == 0
    out, err = capsys.readouterr()
    model = models("llama", "int4")
    tok = mg.Tokenizer(model)
    ids = tok.encode(TEXT)
    tokens, _, _ = generate(mg, model, ids, max_length=40)
    stream = tok.create_stream()
    assert out == "".join(stream.decode(t) for t in tokens) + "\n"
    assert f"prompt: {len(ids)} tokens in" in err and f"decode: {len(tokens) - 1} tokens in" in err
    assert err.count("tokens/s") == 2


def test_generate_sampling_with_a_seed(decoders, capsys):
    folder = decoders[("qwen2", "fp32")]
    args = ["generate", folder, "--prompt", TEXT, "--max-length", "48", "--top-k", "8", "--top-p", "0.9",
            "--temperature", "1.5", "--seed", "5", "--threads", "1"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert main(args[:-4] + ["--seed", "6"]) == 0
    assert capsys.readouterr().out != first


def test_generate_with_the_chat_template(decoders, capsys):
    assert main(["generate", decoders[("gemma", "int4")], "--prompt", "Hi", "--chat", "--max-length", "30",
                 "--repetition-penalty", "1.2"]) == 0
    assert "tokens/s" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--greedy", "--top-k", "4"], "--greedy cannot be combined"),
    (["--max-length", "100000"], "cannot be greater than the model's context_length"),
    (["--max-length", "3"], "exceeds max length"),
])
def test_generate_user_errors(decoders, capsys, extra, message):
    assert main(["generate", decoders[("llama", "fp32")], "--prompt", TEXT, *extra]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (after the artifact's build line, on a first use)
    assert last.startswith("minirt generate: error: ") and message in last


def test_generate_missing_folder(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--prompt", "x"]) == 2
    assert "no genai_config.json" in capsys.readouterr().err


def test_chat_example_non_interactive(decoders):
    folder = decoders[("phi3", "int4")]
    proc = subprocess.run([sys.executable, CHAT, folder, "--max-reply", "12", "--stats", "--max-length", "120"],
                          input="Hello\nWhat is a KV cache?\n/reset\nAgain\n/quit\nnot read\n", capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("tokens/s; reply") == 3
    # a line break after each of the 3 replies (a reply's own text may hold more: the random model's tokens,
    # whose tokenizer is trained on docs/, may include a newline)
    assert proc.stdout.endswith("\n") and proc.stdout.count("\n") >= 3


def test_chat_example_starts_over_when_full(decoders):
    folder = decoders[("llama", "fp32")]
    proc = subprocess.run([sys.executable, CHAT, folder, "--max-reply", "30", "--max-length", "70", "--system", ""],
                          input="one two three\nfour five six\nseven eight\nnine ten\n", capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    assert "starting over" in proc.stderr
