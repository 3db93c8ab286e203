# ph_vae: the functions of its Snakefile (input lists, labels, resources), included by it after the globals they read;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.
from paperflow.ph_vae.settings import decoders_for as ph_vae_decoders_for


def ph_vae_rescale(dataset):
    """The factor a downloaded dataset's values are multiplied by; None where its spec sets none (synthetic sets)."""
    spec = PH_VAE["datasets"][dataset]
    return spec["rescale"] if "rescale" in spec else None


def ph_vae_checkpoints(dataset):
    """{(decoder, seed): checkpoint} of one dataset."""
    return {
        (d, s): ph_vae_path("models", dataset, d, f"seed{s}.ckpt")
        for d in ph_vae_decoders_for(PH_VAE, dataset)
        for s in PH_VAE["seeds"]
    }


def ph_vae_report_inputs(wildcards):
    """The report's inputs, keyed by dataset (and decoder for the training histories)."""
    return {
        **keyed("metrics", {ds: ph_vae_path("eval", ds, "metrics.parquet") for ds in PH_VAE_DATASETS}),
        **keyed("samples", {ds: ph_vae_path("eval", ds, "samples.parquet") for ds in PH_VAE_DATASETS}),
        **keyed("test", {ds: ph_vae_path("data", ds, "test.parquet") for ds in PH_VAE_DATASETS}),
        **keyed(
            "history",
            {
                (ds, d): ph_vae_path("models", ds, d, "history.csv")
                for ds in PH_VAE_DATASETS
                for d in ph_vae_decoders_for(PH_VAE, ds)
            },
        ),
    }
