# dro_flow: the functions of its Snakefile (input lists, labels, resources), included by it after the globals they read;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def dro_flow_cifar10_files():
    """The CIFAR-10 archive and the ImageNet ResNet-50 weights of a cifar dataset (its {dataset} wildcard), cached
    outside the results: download_cifar10 writes them, features reads them."""
    return {
        "images": f"{DRO_FLOW_CACHE}/{{dataset}}/cifar-10-python.tar.gz",
        "weights": f"{DRO_FLOW_CACHE}/{{dataset}}/resnet50_imagenet1k_v1.pth",
    }


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
