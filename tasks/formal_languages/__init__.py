"""Formal languages: parity, modular arithmetic without / with brackets (the paper's Table 2)."""
