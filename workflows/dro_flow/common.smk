# dro_flow: the functions of its Snakefile (input lists, labels, resources), included first by it;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def dro_flow_checkpoints(dataset):
    """{method: checkpoint} of one dataset, for its configured methods."""
    return {m: dro_flow_path("models", dataset, f"{m}.pt") for m in DRO_FLOW_SPECS[dataset]["methods"]}


def dro_flow_report_inputs(wildcards):
    """The report's inputs, keyed by dataset (and method for the training histories)."""
    return {
        **keyed("eval", {n: dro_flow_path("eval", f"{n}.parquet") for n in DRO_FLOW_DATASETS}),
        **keyed(
            "history",
            {
                (n, m): dro_flow_path("models", n, f"{m}_history.csv")
                for n in DRO_FLOW_DATASETS
                for m in DRO_FLOW_SPECS[n]["methods"]
            },
        ),
    }
