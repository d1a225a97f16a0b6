"""``minirt generate MODEL --prompt TEXT``: stream a model's continuation to stdout (minirt/cli.py
parses the arguments and calls :func:`generate`, importing this module only for that command).

The generated text goes to stdout as it is produced; at the end one line on stderr gives the prompt's
and the decode's tokens per second (prefill: the prompt's run and the first token; decode: every later
token, one model run each).
"""
from __future__ import annotations

import argparse
import sys
import time

from minirt.genai._config import GenAIError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a genai model folder (genai_config.json, model.onnx or .mrt, "
                                                  "tokenizer.json) or a .mrt artifact inside one")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-length", type=int, default=None, metavar="N",
                   help="at most N tokens, prompt included (default: genai_config's search.max_length)")
    p.add_argument("--greedy", action="store_true", help="always the most likely token (the default when no sampling "
                                                         "option is given)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample from the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="sample from the smallest set of tokens "
                                                                         "whose probability reaches P")
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="sampling temperature")
    p.add_argument("--repetition-penalty", type=float, default=None, metavar="R",
                   help="divide the logits of tokens already in the text by R (>1 repeats less)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: random)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: every CPU)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat template as one user message")


def generate(args: argparse.Namespace, out=None, err=None) -> int:
    import minirt.genai as og

    out = out or sys.stdout
    err = err or sys.stderr
    sampling = any(v is not None for v in (args.top_k, args.top_p, args.temperature))
    if args.greedy and sampling:
        raise GenAIError("--greedy cannot be combined with --top-k / --top-p / --temperature")
    if args.threads is not None and args.threads < 1:
        raise GenAIError(f"--threads must be positive, got {args.threads}")
    model = og.Model(args.model, threads=args.threads, log=lambda m: print(m, file=err, flush=True))
    tokenizer = og.Tokenizer(model)
    options: dict = {"do_sample": sampling}
    for name, value in (("max_length", args.max_length), ("top_k", args.top_k), ("top_p", args.top_p),
                        ("temperature", args.temperature), ("repetition_penalty", args.repetition_penalty),
                        ("random_seed", args.seed)):
        if value is not None:
            options[name] = value
    if sampling and args.top_k is None:
        options["top_k"] = 0  # (only the options given restrict the distribution)
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    prompt = args.prompt
    if args.chat:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    tokens = tokenizer.encode(prompt)
    generator = og.Generator(model, params)
    stream = tokenizer.create_stream()
    t0 = time.perf_counter()
    generator.append_tokens(tokens)
    t_first = None
    new = 0
    status = 0
    try:
        while not generator.is_done():
            generator.generate_next_token()
            new += 1
            if t_first is None:
                t_first = time.perf_counter()
            out.write(stream.decode(generator.get_next_tokens()[0]))
            out.flush()
    except KeyboardInterrupt:
        status = 130
    t_end = time.perf_counter()
    out.write("\n")
    out.flush()
    t_first = t_first or t_end
    prefill = t_first - t0
    decode = t_end - t_first
    decode_rate = f"{(new - 1) / decode:.1f} tokens/s" if new > 1 and decode > 0 else "n/a"
    print(f"prompt: {len(tokens)} tokens in {prefill:.3f} s ({len(tokens) / prefill:.1f} tokens/s); "
          f"decode: {max(new - 1, 0)} tokens in {decode:.3f} s ({decode_rate})", file=err, flush=True)
    return status
