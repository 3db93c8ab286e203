"""SpaEF (ICML 2026): element-wise denoising of spatial transcriptomics with a spot graph built from
language-model embeddings of spot "gene sentences" and a gene graph filtered by an embedding-based
gene-gene interaction classifier, fused by a gated pair of graph autoencoders with a ZINB loss."""
