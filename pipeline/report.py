"""Human-readable plan output (``specdeploy plan`` without --json)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from pipeline.console import Table
from pipeline.plan import Plan, VariantPlan
from pipeline.resources import StageResources


def _speculative_line(variant: VariantPlan) -> str:
    spec = variant.speculative
    if spec.medusa:
        return f"medusa: {spec.medusa.num_heads} heads, {len(spec.medusa.tree or ())}-node tree"
    if spec.eagle:
        tree = "dynamic (EAGLE-2)" if spec.eagle.dynamic_tree else f"{len(spec.eagle.tree or ())}-node tree"
        return f"eagle: {spec.eagle.num_eagle_layers} layers, {tree}"
    if spec.lookahead:
        la = spec.lookahead
        return f"lookahead: W={la.window} N={la.ngram} G={la.verification_set}"
    return "none"


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


def print_plan(plan: Plan, console: Console) -> None:
    console.print(f"[bold]{plan.spec_name}[/bold] ({plan.spec_file}): {len(plan.variants)} variant(s)")
    for variant in plan.variants:
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
        fits = {True: "[green]fits[/green]", False: "[red]does not fit[/red]", None: "no GPU given"}[
            variant.memory.fits
        ]
        table.add_row("memory", f"{variant.memory.describe()}  {fits}")
        lora = plan.lora_of(variant)
        if lora is not None:
            shared = lora["mode"] == "shared"
            table.add_row(
                "LoRA",
                f"shared: adapter of {lora['group']}, lora_task_id {lora['lora_task_id']}" if shared else "merged",
            )
        for stage in variant.stages:
            table.add_row(f"stage {stage.name}", f"{stage.output}  {_needs(stage.resources)}")
        table.add_row("serve", _needs(variant.serve_resources))
        for note in variant.notes:
            table.add_row("note", escape(note))
        console.print(table)
    for group in plan.lora_groups:
        console.print(group.describe(), highlight=False)
    print_lora_decisions(plan, console)
    if plan.repository is not None:
        from pipeline.triton.spec_repository import sharing_problem

        problem = sharing_problem(plan)
        if problem is None:
            console.print(f"one server for all variants: {plan.repository.output} (`specdeploy serve SPEC`)")
        else:
            console.print(
                "[yellow]the variants cannot share one server[/yellow] (each keeps its own): "
                + "; ".join(problem.splitlines()),
                highlight=False,
            )


def print_lora_decisions(plan: Plan, console: Console) -> None:
    """serving.lora auto: the planner's choice per fine-tune, with its numbers (pipeline/lora/auto.py)."""
    for decision in plan.lora_decisions:
        head, *_ = decision.lines()
        console.print(head, highlight=False, markup=False)
        table = Table("fine-tune", "choice", "method", "share", "speedup", "GiB per GPU", "why")
        for c in decision.choices:
            memory = ", ".join(f"GPU {g} +{gib:.2f}" for g, gib in sorted(c.memory_gib.items())) or "-"
            share = "-" if c.share != c.share else f"{c.share:.3f}"  # NaN: not weighed (no GPU)
            speedup = "-" if c.speedup != c.speedup else f"{c.speedup:.2f}x"
            table.add_row(c.name, c.choice, c.method, share, speedup, memory, escape(c.reason))
        console.print(table)
        if any("assumed (published median)" in c.reason for c in decision.choices):
            console.print(
                "an assumed acceptance length is the published results' median for the method; "
                "`specdeploy evaluate SPEC` measures each fine-tune's, and the decision then uses it",
                highlight=False,
            )
