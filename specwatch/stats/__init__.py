"""Pure statistics for acceptance-drop detection: no I/O, no clocks, nothing from the rest of specwatch.

- `cusum`: the φ-scaled Bernoulli log-likelihood ratio, a one-sided CUSUM and a Wald SPRT built on it.
- `wilson`: Wilson score bounds with an effective sample size.
- `overdispersion`: the design effect φ of drafted tokens (a plain φ̂ and a line in block size), from blocks.

`docs/detection.md` explains the choices and how to tune them.
"""
