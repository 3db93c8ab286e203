from paperflow.core.job import snakemake_job
from paperflow.promptscale.annotate import annotate
from paperflow.promptscale.llm_text import model_folder

with snakemake_job(snakemake) as job:
    p = job.params
    summary = annotate(
        job.wildcards.annotator,
        model_folder(job.input.model),
        job.input.statements,
        p.settings,
        p.vllm,
        job.output.triples,
        job.output.summary,
        job.log_file + ".vllm",
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished prompts; a rerun asks only for the rest
    )
    job.note(seeds=[p.settings["seed"]], share=summary["share"], kept=summary["kept"], **summary["dropped"])
