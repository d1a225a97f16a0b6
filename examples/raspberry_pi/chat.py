#!/usr/bin/env python3
"""Chat with a small language model on a Raspberry Pi, with minirt.genai.

    python3 chat.py MODEL_DIR                       # greedy replies
    python3 chat.py MODEL_DIR --temperature 0.7 --top-p 0.9 --top-k 40
    echo "What is minirt?" | python3 chat.py MODEL_DIR --max-length 256

MODEL_DIR is an onnxruntime-genai model folder (genai_config.json, model.onnx or model.mrt, tokenizer.json,
tokenizer_config.json), e.g. written on a desktop by
``python -m onnxruntime_genai.models.builder -m MODEL -o MODEL_DIR -p int4 -e cpu``.  On the Pi, build the
.mrt once where the builder is installed (``minirt build MODEL_DIR/model.onnx -o MODEL_DIR/model.mrt``)
or let minirt.genai build it on first use when the builder is there.

Each turn is wrapped in the model's chat template (tokenizer_config.json "chat_template" or
chat_template.jinja; a plain "User:/Assistant:" layout when there is none) and appended to the same
generator, so the conversation's KV cache is reused across turns: only the new turn is computed.
When the conversation would exceed --max-length, it starts over (the system prompt kept).  The reply
streams as it is generated; --stats prints prompt and reply tokens/s after each reply.

Type /reset to start over, /quit (or end of input) to leave.  The script needs numpy, minirt and the
``tokenizers`` package (``pip install 'minirt[genai]'``); jinja2 for chat templates.
"""
from __future__ import annotations

import argparse
import sys
import time

import minirt.genai as og


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Interactive chat with a language model folder, on minirt.")
    p.add_argument("model", help="onnxruntime-genai model folder (genai_config.json, model.onnx/.mrt, tokenizer)")
    p.add_argument("--system", default="You are a helpful assistant.", help="system prompt ('' for none)")
    p.add_argument("--max-length", type=int, default=None,
                   help="conversation length in tokens (default: genai_config's search.max_length)")
    p.add_argument("--max-reply", type=int, default=256, help="at most this many tokens per reply (default 256)")
    p.add_argument("--temperature", type=float, default=None, help="sample with this temperature (default: greedy)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set reaching probability P")
    p.add_argument("--repetition-penalty", type=float, default=None, help="e.g. 1.1 to repeat less")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: all cores)")
    p.add_argument("--stats", action="store_true", help="print tokens/s after each reply")
    return p


def render(tokenizer: og.Tokenizer, messages: list[dict], first: bool) -> str:
    """The text of ``messages`` (a turn) through the chat template, or a plain layout without one."""
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except og.GenAIError:
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
        return ("" if first else "\n") + "\n".join(lines) + "\nAssistant:"


class Chat:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.model = og.Model(args.model, threads=args.threads,
                              log=lambda m: print(m, file=sys.stderr, flush=True))
        self.tokenizer = og.Tokenizer(self.model)
        options: dict = {}
        sampling = any(v is not None for v in (args.temperature, args.top_k, args.top_p))
        options["do_sample"] = sampling
        for name in ("temperature", "top_k", "top_p", "repetition_penalty"):
            value = getattr(args, name)
            if value is not None:
                options[name] = value
        if sampling and args.top_k is None:
            options["top_k"] = 0
        if args.seed is not None:
            options["random_seed"] = args.seed
        if args.max_length is not None:
            options["max_length"] = args.max_length
        self.params = og.GeneratorParams(self.model)
        self.params.set_search_options(**options)
        self.max_length = self.params.get_search_options()["max_length"]
        self.reset()

    def reset(self) -> None:
        self.generator = og.Generator(self.model, self.params)
        self.first = True

    def turn(self, text: str, out=sys.stdout) -> str:
        messages = [{"role": "user", "content": text}]
        if self.first and self.args.system:
            messages.insert(0, {"role": "system", "content": self.args.system})
        tokens = self.tokenizer.encode(render(self.tokenizer, messages, self.first))
        if not self.first and len(tokens) and tokens[0] == self.tokenizer.bos_token_id:
            tokens = tokens[1:]  # (one BOS per conversation)
        needed = self.generator.token_count() + len(tokens) + 1
        if needed > self.max_length:
            if self.first or len(tokens) + 1 > self.max_length:
                raise og.GenAIError(f"the message is {len(tokens)} tokens: longer than --max-length "
                                    f"{self.max_length} allows")
            print("[the conversation is full: starting over]", file=sys.stderr)
            self.reset()
            return self.turn(text, out)
        self.first = False
        stream = self.tokenizer.create_stream()
        t0 = time.perf_counter()
        self.generator.append_tokens(tokens)
        t1 = None
        reply = []
        n = 0
        while not self.generator.is_done() and n < self.args.max_reply:
            self.generator.generate_next_token()
            if t1 is None:
                t1 = time.perf_counter()
            n += 1
            piece = stream.decode(self.generator.get_next_tokens()[0])
            reply.append(piece)
            out.write(piece)
            out.flush()
        t2 = time.perf_counter()
        out.write("\n")
        if self.generator.is_done() and self.generator.token_count() >= self.max_length:
            print("[the conversation is full: starting over]", file=sys.stderr)
            self.reset()
        if self.args.stats and t1 is not None:
            rate = f"{(n - 1) / (t2 - t1):.1f}" if n > 1 and t2 > t1 else "n/a"
            print(f"[prompt {len(tokens)} tokens, {len(tokens) / (t1 - t0):.1f} tokens/s; reply {n} tokens, "
                  f"{rate} tokens/s]", file=sys.stderr)
        return "".join(reply)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        chat = Chat(args)
    except og.GenAIError as exc:
        print(f"chat.py: error: {exc}", file=sys.stderr)
        return 2
    interactive = sys.stdin.isatty()
    if interactive:
        print("Type a message (/reset to start over, /quit to leave).", file=sys.stderr)
    while True:
        try:
            text = input("> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:
            print()
            break
        text = text.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            chat.reset()
            continue
        try:
            chat.turn(text)
        except KeyboardInterrupt:
            print("\n[interrupted]", file=sys.stderr)
        except og.GenAIError as exc:
            print(f"chat.py: error: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
