"""mtbl_wc: multi-task bilevel learning as equality-constrained multi-objective optimisation, solved
by a weighted-Chebyshev penalty method (Zhang, Oh, Qin, Li, Zhang, Liu; ICML 2026).

Modules: `qp` (min-norm point on the simplex), `kkt` (KKT-based Pareto stationarity), `fronts`
(seeded instances and closed-form fronts), `problems` (the ECMO problems in torch), `algorithm`
(WC-penalty, LS-penalty, MGDA-penalty, deterministic and stochastic), `data` (digits hyper-cleaning),
`evaluation` (per-run metrics), `claims` (claims, tables, figures, report), `settings` (config checks).
"""
