//! Pool-size theory: the law-of-large-numbers bound E[R] ≈ 1 + (CV/√P)·√(2 ln(D/P))
//! (Libra §3, Eq. 4) and its Monte-Carlo check under random grouping. Reads workload/
//! directly and needs no engine.
