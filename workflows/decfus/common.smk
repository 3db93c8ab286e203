# decfus: the functions of its Snakefile (input lists, labels, resources), included first by it;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def decfus_split(dataset, partition, seed):
    """The client partition file of one seed."""
    return decfus_path("splits", dataset, partition, f"seed{seed}.json")


def decfus_runs(name, dataset, partitions):
    """{(partition, method, group): file `name` of that training job} on one dataset."""
    return {
        (p, m, g): decfus_path(DECFUS_RUN.format(dataset=dataset, partition=p, method=m, group=g), name)
        for p in partitions
        for m in DECFUS_METHODS
        for g in DECFUS_GROUPS
    }


def decfus_evaluate_inputs(wildcards):
    """One (dataset, partition)'s training jobs: curves, client logs and checkpoint, keyed by (method, group)."""
    inputs = {}
    for kind, name in (("curves", "curves.csv"), ("clients", "clients.csv"), ("ckpt", "final.pt")):
        runs = decfus_runs(name, wildcards.dataset, [wildcards.partition])
        inputs |= keyed(kind, {(m, g): path for (_p, m, g), path in runs.items()})
    return inputs


def decfus_report_inputs(wildcards):
    """The evaluation of every (dataset, partition), and the claim dataset's run logs keyed by
    (partition, method, group)."""
    claim_dataset = DECFUS["claim_dataset"]
    return {
        **keyed(
            "eval",
            {(ds, p): decfus_path("eval", ds, f"{p}.parquet") for ds in DECFUS_DATASETS for p in DECFUS_PARTITIONS},
        ),
        **keyed("curves", decfus_runs("curves.csv", claim_dataset, DECFUS_PARTITIONS)),
        **keyed("clients", decfus_runs("clients.csv", claim_dataset, DECFUS_PARTITIONS)),
    }
