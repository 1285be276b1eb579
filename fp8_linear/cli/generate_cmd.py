"""``fp8-linear generate MODEL --prompt TEXT``: greedy generation from any model ``eval`` takes (a bundled
name, an HF folder, a ``.gguf`` file, an FP8 checkpoint), streamed to stdout, with tokens/s on stderr."""

from __future__ import annotations

import sys
import time

from .checks import check_model, require_positive
from .common import EXIT_OK, CLIError
from .eval_cmd import max_positions
from .loading import load
from .options import MODEL_HELP, add_run_options
from .threads import set_threads

MODEL_FLAG = "MODEL"
DEFAULT_MAX_NEW_TOKENS = 32


def _streamer(tok, skip_prompt: bool):
    """A ``transformers.TextStreamer`` printing to stdout as tokens arrive, that also records the time
    each new token came (``.times``)."""
    from transformers import TextStreamer

    class TimedStreamer(TextStreamer):
        def __init__(self):
            super().__init__(tok, skip_prompt=skip_prompt, skip_special_tokens=True)
            self.times: list[float] = []
            self._prompt_seen = False

        def put(self, value):
            if self._prompt_seen:
                self.times.extend([time.perf_counter()] * (value.numel() if value.dim() <= 1 else value.shape[-1]))
            self._prompt_seen = True
            super().put(value)

    return TimedStreamer()


def speed_line(new_tokens: int, t0: float, times: list[float]) -> str:
    """``N new tokens in T s (X tokens/s; first token after P s, then Y tokens/s)`` from the start time and
    the arrival time of each new token (``time.perf_counter`` seconds)."""
    if not times or new_tokens == 0:
        return "no new tokens (the model ended the text at once)"
    total = times[-1] - t0
    line = f"{new_tokens} new tokens in {total:.2f} s ({new_tokens / total:.2f} tokens/s"
    if len(times) > 1 and times[-1] > times[0]:
        line += f"; first token after {times[0] - t0:.2f} s, then {(len(times) - 1) / (times[-1] - times[0]):.2f} tokens/s"
    return line + ")"


def run(args) -> int:
    import torch

    from fp8_linear.calibration.evaluate import is_causal_lm

    require_positive(args, "max_new_tokens")
    if not args.prompt.strip():
        raise CLIError("--prompt: expected some text, got an empty prompt")
    check_model(args.model, MODEL_FLAG)
    set_threads(args.threads)
    model, tok = load(args.model, args.dtype, MODEL_FLAG)
    name = args.model or "smollm2"
    if not is_causal_lm(model):
        raise CLIError(f"{MODEL_FLAG}: {name!r} is a {type(model).__name__}, not a causal LM: it cannot generate text")
    if tok is None:
        raise CLIError(f"{MODEL_FLAG}: {name!r} has no tokenizer to read --prompt with (save the checkpoint with its tokenizer)")
    if args.chat:
        if not getattr(tok, "chat_template", None):
            raise CLIError(f"--chat: the tokenizer of {name!r} has no chat template")
        ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
    else:
        ids = tok(args.prompt, return_tensors="pt").input_ids
    limit = max_positions(model)
    if limit is not None and ids.shape[1] + args.max_new_tokens > limit:
        flag = "--prompt" if ids.shape[1] >= limit else "--max-new-tokens"
        raise CLIError(f"{flag}: the prompt's {ids.shape[1]} tokens + {args.max_new_tokens} new ones exceed the model's "
                       f"{limit} positions")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    streamer = _streamer(tok, skip_prompt=args.chat)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                             do_sample=False, pad_token_id=pad, streamer=streamer)
    print(flush=True)
    new = int(out.shape[1] - ids.shape[1])
    print(speed_line(new, t0, streamer.times), file=sys.stderr, flush=True)
    return EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a model or FP8 checkpoint, with tokens/s",
                       description="Greedy generation from any model eval accepts (a bundled name, an HF folder, a .gguf "
                                   "file, an FP8 checkpoint): the text goes to stdout as it is generated, the speed "
                                   "(tokens/s) to stderr.")
    p.add_argument("model", metavar=MODEL_FLAG, nargs="?", default=None, help=f"{MODEL_HELP}")
    p.add_argument("-p", "--prompt", required=True, help="the text to continue (or, with --chat, the user's message)")
    p.add_argument("-n", "--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                   help="most tokens to generate (default %(default)s; fewer if the model ends the text)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the tokenizer's chat template and print only the reply "
                        "(default: continue the prompt as plain text, printed with it)")
    add_run_options(p)
    p.set_defaults(func=run, flags={"model": MODEL_FLAG})
