"""dro_flow (Xu & Zhu, ICML 2026): gradient-flow samplers (WGF, WFR, SVGD, RGO) for the worst-case
distribution of entropy-regularised Wasserstein DRO, with ERM, WRM and dual Sinkhorn-DRO baselines.

Modules: `data` (seeded generators, numpy/scikit-learn), `prepare` (download/preprocess stages),
`problems` (per-particle losses and models, torch), `samplers` (the inner particle flows),
`training` (the outer loop; `fabric` drives it at paper scale), `attacks` + `evaluation` (test loss under shift, FGSM/PGD),
`features` (CIFAR-10 ResNet-50 features without torchvision), `claims` (report), `settings`.
"""
