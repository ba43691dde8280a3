"""`specdeploy query "PROMPT"`: one request to a running server, text printed as it streams.

The prompt is wrapped in the chat template of the model the server serves: the package stage
stores it in the preprocessing model's config, which the server returns on request, so the
command works the same from any directory. ``--repo`` takes the template from a repository on
disk instead; ``--no-chat`` sends the raw text, exactly as any other client of the ensemble would.

With ``--url http://HOST:PORT`` it asks an OpenAI-compatible server instead (target ``pytorch``:
``trtllm-serve`` or its CPU stand-in): ``/v1/chat/completions``, or ``/v1/completions`` with
``--no-chat``; ``--model`` is the fine-tune's name there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.common import add_json_flag, print_json

if TYPE_CHECKING:
    from rich.console import Console

if TYPE_CHECKING:  # the client imports tritonclient (gRPC): only the commands that talk to a server pay for it
    from pipeline.client import GenerationRequest, GenerationResult, Piece, TritonClient
    from pipeline.client.chat import ChatTemplate


def chat_template(args: argparse.Namespace, client: TritonClient) -> ChatTemplate | None:
    from pipeline.client.chat import preprocessing_model, repo_template, served_template

    if args.repo:
        return repo_template(Path(args.repo))
    name = preprocessing_model(client.model_config(args.model))
    return served_template(client.model_config(name), f"{args.url} model {name}")


def request_from_args(args: argparse.Namespace, prompt: str, *, perf: bool) -> GenerationRequest:
    from pipeline.client import GenerationRequest

    return GenerationRequest(
        prompt=prompt,
        max_tokens=args.max_tokens,
        stream=getattr(args, "stream", True),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_words=tuple(args.stop or ()),
        return_perf_metrics=perf,
        # bench --ignore-eos: end_id -1, which no token matches, so every request decodes max_tokens
        end_id=-1 if getattr(args, "ignore_eos", False) else None,
    )


def perf_lines(result: GenerationResult) -> list[str]:
    first = result.first_token_seconds
    rate = result.tokens / result.total_seconds if result.total_seconds > 0 else 0.0
    lines = [
        f"-- {result.tokens} tokens in {result.total_seconds:.2f} s: {rate:.1f} tokens/s"
        + (f", first token after {first * 1000:.0f} ms" if first is not None else "")
    ]
    perf = result.perf
    if "total_draft_tokens" in perf:
        length = result.mean_acceptance_length
        lines.append(
            f"-- acceptance rate {perf.get('acceptance_rate', 0.0):.2f} "
            f"({perf.get('total_accepted_draft_tokens', 0):.0f} of {perf['total_draft_tokens']:.0f} draft "
            f"tokens accepted), mean acceptance length "
            + (f"{length:.2f}" if length is not None else "n/a")
            + " tokens/step"
        )
    else:
        lines.append("-- no acceptance statistics in the response (plain decoding, or the backend sent none)")
    return lines


def query_openai(args: argparse.Namespace) -> int:
    """``--url http://...``: an OpenAI-compatible server (target pytorch: trtllm-serve or its stand-in)."""
    from pipeline.client.openai_http import complete, standin_metrics
    from pipeline.errors import InputError

    if args.top_k is not None or args.repo is not None:
        raise InputError("--top-k and --repo are for a Triton server; an OpenAI-compatible one takes --top-p")
    result = complete(
        args.url,
        args.model,
        args.prompt,
        chat=args.chat is not False,
        system=args.system,
        timeout=args.timeout,
        max_tokens=args.max_tokens,
        temperature=0.0 if args.temperature is None else args.temperature,  # unset: greedy, as with Triton
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
    )
    metrics = standin_metrics(args.url) if args.perf else None
    served = (metrics or {}).get("models", {}).get(args.model)
    if args.json:
        print_json(
            {
                "model": args.model,
                "prompt": args.prompt,
                "text": result.text,
                "tokens": result.completion_tokens,
                "seconds": result.seconds,
                "first_token_seconds": result.first_token_seconds,
                "finish_reason": result.finish_reason,
                "served": served,
            }
        )
        return 0
    print(result.text)
    if args.perf:
        rate = result.completion_tokens / result.seconds if result.seconds > 0 else 0.0
        first = "" if result.first_token_seconds is None else f", first token after {result.first_token_seconds:.2f} s"
        print(f"-- {result.completion_tokens} tokens in {result.seconds:.2f} s: {rate:.1f} tokens/s{first}")
        if served is not None:
            print(
                f"-- {args.model} so far: acceptance rate {served['acceptance_rate']:.2f} "
                f"({served['accepted_draft_tokens']} of {served['draft_tokens']} draft tokens accepted), "
                f"mean acceptance length {served['acceptance_length']:.2f} tokens/step"
            )
        else:
            print("-- no acceptance statistics from this server (trtllm-serve reports them in its /metrics)")
    return 0


def cmd_query(args: argparse.Namespace, console: Console) -> int:
    from pipeline.client import TritonClient
    from pipeline.errors import InputError

    if args.url.startswith(("http://", "https://")):
        return query_openai(args)

    def show(piece: Piece) -> None:
        if args.json:  # the answer comes whole, in the document
            return
        sys.stdout.write(piece.text)
        sys.stdout.flush()

    with TritonClient(args.url, args.model, timeout=args.timeout) as client:
        prompt = args.prompt
        if args.chat is not False:
            template = chat_template(args, client)
            if template is not None:
                prompt = template.render(prompt, args.system)
            elif args.chat:  # asked for explicitly: say why it cannot be done
                source = args.repo or f"the server at {args.url}"
                raise InputError(
                    f"{source}: the served model has no chat template (a tokenizer without one, or "
                    "packaged by an older specdeploy: re-run `specdeploy engine`); send raw text "
                    "(--no-chat)"
                )
            # Default: without a chat template there is nothing to format with; the text goes as it is.
        result = client.generate(request_from_args(args, prompt, perf=args.perf), on_piece=show)
    if args.json:
        print_json(
            {
                "model": args.model,
                "prompt": prompt,
                "text": result.text,
                "tokens": result.tokens,
                "seconds": result.total_seconds,
                "first_token_seconds": result.first_token_seconds,
                "mean_acceptance_length": result.mean_acceptance_length,
                "perf": result.perf,
            }
        )
        return 0
    sys.stdout.write("\n")
    if args.perf:
        print("\n".join(perf_lines(result)))
    return 0


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default="127.0.0.1:8001",
        help="Triton gRPC address (default 127.0.0.1:8001); http://HOST:PORT: an OpenAI-compatible server "
        "(target pytorch: trtllm-serve or its CPU stand-in)",
    )
    parser.add_argument(
        "--model",
        default="ensemble",
        help="the model to ask: the ensemble (serving.model_name, default 'ensemble'; on a server of a whole "
        "spec, the variant's name) or tensorrt_llm_bls",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most")
    parser.add_argument("--temperature", type=float, help="unset: the backend's default (greedy)")
    parser.add_argument("--top-k", type=int, help="sample from the k likeliest tokens (unset: the backend's default)")
    parser.add_argument("--top-p", type=float, help="sample from the smallest set of tokens holding this probability")
    parser.add_argument("--seed", type=int, help="the sampler's random seed (unset: the backend's default)")
    parser.add_argument("--stop", action="append", metavar="WORD", help="stop word (repeatable)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the whole answer")


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the subcommand; handlers take (args, console) and return an exit code."""
    query = commands.add_parser("query", help="send a prompt to a running server and stream the answer")
    query.add_argument("prompt", help="the prompt (sent through the model's chat template unless --no-chat)")
    add_sampling_arguments(query)
    query.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="one response at the end (still over the streaming RPC)",
    )
    query.add_argument("--perf", action="store_true", help="print speed and speculative acceptance")
    query.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap the prompt in the served model's chat template (default: when it has one; --no-chat sends raw text)",
    )
    query.add_argument("--system", help="system message for --chat")
    query.add_argument("--repo", help="take the chat template from this repository on disk instead of the server")
    add_json_flag(
        query,
        'the answer, once complete: {"model", "prompt" (as sent, chat template applied), "text", "tokens", '
        '"seconds", "first_token_seconds", "mean_acceptance_length", "perf": {...} (with --perf)}',
    )
    query.set_defaults(handler=cmd_query)
