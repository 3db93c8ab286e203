import anndata as ad

from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.spaef.preprocess import preprocess

with snakemake_job(snakemake) as job:
    cfg = job.params.preprocess
    adata, sentences = preprocess(
        ad.read_h5ad(job.input[0]), cfg["gene_frac"], cfg["spot_frac"], cfg["sentence_length"]
    )
    adata.write_h5ad(job.output.adata)
    write_frame(job.output.sentences, sentences, {"sentence_length": cfg["sentence_length"]})
    job.note(n_spots=adata.n_obs, n_genes=adata.n_vars)
