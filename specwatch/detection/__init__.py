"""Pure statistics for acceptance-drop detection: no I/O, no clocks, no specwatch imports.

- `cusum`: the φ-scaled Bernoulli log-likelihood ratio, a one-sided CUSUM and a Wald SPRT built on it.
- `wilson`: Wilson score bounds with an effective sample size.
- `overdispersion`: the design effect φ of drafted tokens, estimated from blocks of traffic.

`docs/detection.md` explains the choices and how to tune them.
"""
