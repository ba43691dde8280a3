"""Human-readable plan output (``specdeploy plan`` without --json)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from pipeline.console import Table
from pipeline.plan.resources import StageResources
from pipeline.plan.types import Plan, VariantPlan


def _speculative_line(variant: VariantPlan) -> str:
    config = variant.speculative.config
    return "none" if config is None else config.describe()


def _needs(resources: StageResources | None) -> str:
    if resources is None:
        return ""
    gpus = f"{resources.gpus} GPU x {resources.gpu_memory_gib_per_gpu:.1f} GiB" if resources.gpus else "no GPU"
    text = f"needs {gpus}, host RAM {resources.host_memory_gib:.1f} GiB, disk {resources.disk_gib:.1f} GiB"
    if resources.one_worker is not None:
        text += f" (one worker: host RAM {resources.one_worker.host_memory_gib:.1f} GiB)"
    return text


def _measured_choice(variant: VariantPlan) -> list[tuple[str, str]]:
    """Plan rows for the evaluate stage's choice, when this variant has been evaluated, and a warning
    row when that evaluation is out of date (its inputs or settings no longer have the recorded
    fingerprint)."""
    from pipeline.evaluation.result import read_result
    from pipeline.stages.runner import fingerprint, recorded_fingerprint

    stage = next((s for s in variant.stages if s.name == "evaluate"), None)
    result = read_result(stage.output) if stage else None
    if not stage or not result:
        return []
    choice = result["choice"]
    # Candidate names are not markup: "eagle[cpu_small_10_depth_3]" would vanish as a style tag.
    failed = f"  [red]release gate failed[/red]: {escape(choice['failed'])}" if choice.get("failed") else ""
    rows = [("measured choice", f"{escape(choice['candidate'])}: {escape(choice['reason'])}{failed}")]
    if (recorded_fingerprint(stage.output) or {}).get("digest") != fingerprint(stage)["digest"]:
        rows.append(
            (
                "evaluation",
                "[yellow]out of date[/yellow]: the model, heads or evaluation settings changed since it ran; "
                "`specdeploy engine` evaluates again",
            )
        )
    return rows


# A spec of more variants than this leads with its answer and one row per variant; the whole table of
# each variant is then for --details or --variant NAME.
SUMMARY_ABOVE = 3


def print_plan(plan: Plan, console: Console, details: bool = False, only: frozenset[str] = frozenset()) -> None:
    """The plan as a person reads it: the answer first (does it fit, the LoRA decision, one server or
    not), then each variant; ``details`` (or a spec of few variants) prints each variant's whole table,
    ``only`` just those variants."""
    variants = [v for v in plan.variants if not only or v.name in only]
    console.print(f"[bold]{plan.spec_name}[/bold] ({plan.spec_file}): {len(plan.variants)} variant(s)")
    _print_answer(plan, console)
    if details or only or len(plan.variants) <= SUMMARY_ABOVE:
        for variant in variants:
            _print_variant(plan, variant, console)
        for group in plan.lora_groups:
            console.print(group.describe(), highlight=False)
        print_lora_decisions(plan, console)
        _print_server(plan, console)
        return
    _print_summary(plan, console)
    _print_server(plan, console)
    console.print(
        "each variant's build, stages and notes: `specdeploy plan SPEC --variant NAME` (every one: --details)",
        highlight=False,
        markup=False,
    )


def _print_answer(plan: Plan, console: Console) -> None:
    """Does it fit, and what the LoRA decision predicts: the lines a reader wants first."""
    fits = [v.memory.fits for v in plan.variants]
    wrong = [v.name for v in plan.variants if v.memory.fits is False]
    targets = ", ".join(sorted({v.target for v in plan.variants}))
    gpus = ", ".join(sorted({f"{v.gpu_count} x {v.gpu.name}" for v in plan.variants if v.gpu is not None}))
    if wrong:
        verdict = f"[red]does not fit[/red] on {gpus}: {', '.join(wrong)}"
    elif all(f is None for f in fits):
        verdict = "no gpu.type given: memory not checked"
    else:
        verdict = f"[green]fits[/green] on {gpus}"
    console.print(f"  target {targets}: {verdict}", highlight=False)
    for decision in plan.lora_decisions:
        d = decision.decision
        if d is None:
            continue
        merged = sum(c.choice == "merged" for c in decision.choices)
        shared = sum(c.choice == "shared" for c in decision.choices)
        per_gpu = ", ".join(f"GPU {g} {u:.1f} of {f:.1f}" for g, (u, f) in enumerate(zip(d.used_gib, d.free_gib)))
        speculates = decision.shared_compared or decision.shared_method not in (None, "none")
        running = f" running {decision.shared_engine_text()}" if speculates else ""
        console.print(
            f"  fine-tunes of {decision.base}: {shared} shared on one engine{running}, {merged} merged; fleet speedup "
            f"[bold]{d.fleet_speedup:.2f}x[/bold] at concurrency {d.concurrency} (all shared "
            f"{d.all_shared_speedup:.2f}x); GiB used: {per_gpu}",
            highlight=False,
        )


def _print_summary(plan: Plan, console: Console) -> None:
    """One row per variant (with its share of the traffic and predicted speedup where the LoRA decision
    weighed it), then the notes, each once with the variants it is about."""
    weighed = {c.name: c for decision in plan.lora_decisions for c in decision.choices}
    lora_columns = bool(plan.lora_groups or plan.lora_decisions)
    table = Table(
        "variant", "method", "tp x pp", "GiB per GPU", *(("LoRA", "share", "speedup") if lora_columns else ())
    )
    notes: dict[str, list[str]] = {}
    for variant in plan.variants:
        lora = plan.lora_of(variant)
        mode = "-" if lora is None else "merged" if lora["mode"] != "shared" else "shared"
        if lora is not None and mode == "shared" and len(plan.lora_groups) > 1:
            mode = f"shared ({lora['group']})"
        fits = {True: "", False: " [red]over[/red]", None: ""}[variant.memory.fits]
        choice = weighed.get(variant.name)
        share = "-" if choice is None or choice.share != choice.share else f"{choice.share:.3f}"  # NaN: not weighed
        speedup = "-" if choice is None or choice.speedup != choice.speedup else f"{choice.speedup:.2f}x"
        table.add_row(
            variant.name,
            escape(_speculative_line(variant)),
            f"{variant.tp} x {variant.pp}",
            f"{variant.memory.total_gib:.1f}{fits}",
            *((mode, share, speedup) if lora_columns else ()),
        )
        for note in variant.notes:  # a note that names its variant is the same note for each
            notes.setdefault(note.replace(variant.name, "<variant>"), []).append(variant.name)
    console.print(table)
    for note, names in notes.items():
        who = names[0] if len(names) == 1 else f"{len(names)} variants" if len(names) > 3 else ", ".join(names)
        text = note.replace("<variant>", names[0]) if len(names) == 1 else note
        console.print(f"  note ({who}): {escape(text)}", highlight=False)


def _print_variant(plan: Plan, variant: VariantPlan, console: Console) -> None:
    build = variant.build
    table = Table(title=f"variant {variant.name}", show_header=False, title_justify="left")
    table.add_column("key", style="cyan")
    table.add_column("value")
    table.add_row("method", f"{_speculative_line(variant)}  ({escape(variant.speculative.reason)})")
    for key, value in _measured_choice(variant):
        table.add_row(key, value)
    table.add_row("model", f"{variant.arch.name}  ({variant.model_dir or 'preset only'})")
    table.add_row("target", variant.target + (f" on {variant.gpu.name}" if variant.gpu else ""))
    table.add_row("parallel", f"tp={variant.tp} pp={variant.pp} (world size {variant.world_size})")
    quant = variant.quant
    table.add_row(
        "quantization",
        f"weights {quant.quant_algo or variant.build.dtype}, "
        f"KV cache {quant.kv_cache_quant_algo or variant.build.dtype}",
    )
    table.add_row(
        "build",
        f"max_batch_size={build.max_batch_size} max_input_len={build.max_input_len} "
        f"max_seq_len={build.max_seq_len}->{build.engine_max_seq_len} "
        f"max_num_tokens={build.max_num_tokens}->{build.engine_max_num_tokens} "
        f"max_draft_len={build.max_draft_len}",
    )
    fits = {True: "[green]fits[/green]", False: "[red]does not fit[/red]", None: "no GPU given"}[variant.memory.fits]
    table.add_row("memory", f"{variant.memory.describe()}  {fits}")
    lora = plan.lora_of(variant)
    if lora is not None:
        shared = lora["mode"] == "shared"
        table.add_row(
            "LoRA", f"shared: adapter of {lora['group']}, lora_task_id {lora['lora_task_id']}" if shared else "merged"
        )
    for stage in variant.stages:
        table.add_row(f"stage {stage.name}", f"{stage.output}  {_needs(stage.resources)}")
    table.add_row("serve", _needs(variant.serve_resources))
    for note in variant.notes:
        table.add_row("note", escape(note))
    console.print(table)


def _print_server(plan: Plan, console: Console) -> None:
    if plan.repository is None:
        return
    from pipeline.fleet.placement import sharing_problem

    problem = sharing_problem(plan)
    if problem is None:
        console.print(f"one server for all variants: {plan.repository.output} (`specdeploy serve SPEC`)")
    else:
        console.print(
            "[yellow]the variants cannot share one server[/yellow] (each keeps its own): "
            + "; ".join(problem.splitlines()),
            highlight=False,
        )


def print_lora_decisions(plan: Plan, console: Console, reasons_once: bool = False) -> None:
    """serving.lora auto: the planner's choice per fine-tune, with its numbers (pipeline/lora/auto.py);
    ``reasons_once``: a reason several fine-tunes share is printed once under the table, by number."""
    for decision in plan.lora_decisions:
        head, *_ = decision.lines()
        console.print(head, highlight=False, markup=False)
        table = Table("fine-tune", "choice", "method", "share", "speedup", "GiB per GPU", "why")
        reasons: dict[str, int] = {}
        for c in decision.choices:
            memory = ", ".join(f"GPU {g} +{gib:.2f}" for g, gib in sorted(c.memory_gib.items())) or "-"
            share = "-" if c.share != c.share else f"{c.share:.3f}"  # NaN: not weighed (no GPU)
            speedup = "-" if c.speedup != c.speedup else f"{c.speedup:.2f}x"
            why = escape(c.reason)
            if reasons_once:
                why = f"[{reasons.setdefault(c.reason, len(reasons) + 1)}]"
            table.add_row(c.name, c.choice, c.method, share, speedup, memory, why)
        console.print(table)
        for reason, number in reasons.items():
            console.print(f"  \\[{number}] {escape(reason)}", highlight=False)
        if any("assumed (published median)" in c.reason for c in decision.choices):
            console.print(
                "an assumed acceptance length is the published results' median for the method; "
                "`specdeploy evaluate SPEC` measures each fine-tune's, and the decision then uses it",
                highlight=False,
            )
