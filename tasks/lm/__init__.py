"""Language modelling and its evaluations: data, tokenizer, LM training, lm-eval, extrapolation, effective rank, throughput."""
