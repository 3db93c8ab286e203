# spaef: the functions of its Snakefile (input lists, labels, resources), included first by it;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def spaef_denoised(sample, seeds, suffix=".h5ad"):
    """{(method, seed): denoised file} of one sample."""
    return {(m, s): spaef_path("denoised", sample, m, f"seed{s}{suffix}") for m in SPAEF["methods"] for s in seeds}


def spaef_train_outputs():
    """The train rule's outputs: each method's denoised file and history of one {sample}, {seed}."""
    files = lambda suffix: {m: spaef_path("denoised", "{sample}", m, f"seed{{seed}}{suffix}") for m in SPAEF["methods"]}
    return {**keyed("denoised", files(".h5ad")), **keyed("history", files("_history.csv"))}


def spaef_report_inputs(wildcards):
    """The report's inputs, keyed by sample, (sample, seed) unit, method."""
    plot_sample, plot_seed = SPAEF_PLOT_UNIT
    return {
        **keyed("metrics", {s: spaef_path("eval", s, "metrics.parquet") for s in SPAEF_SAMPLES}),
        **keyed("graphs", {(s, k): spaef_path("graphs", s, f"seed{k}.parquet") for s, k in SPAEF_UNITS}),
        **keyed(
            "history",
            {
                (s, k, m): path
                for s, k in SPAEF_UNITS
                for (m, _), path in spaef_denoised(s, [k], "_history.csv").items()
            },
        ),
        "plot_adata": spaef_path("data", plot_sample, "proc.h5ad"),
        "plot_baselines": spaef_path("denoised", plot_sample, "baselines.h5ad"),
        **keyed(
            "plot_denoised",
            {m: spaef_path("denoised", plot_sample, m, f"seed{plot_seed}.h5ad") for m in SPAEF_PLOT_METHODS},
        ),
    }
