"""Training fxcost's learned models on measurement directories: the one MLP trainer (``mlp``), the heads
(``heads``, ``fxcost train``), Justus et al.'s networks (``justus``), and every op-level predictor
compared on the same held-out rows (``compare``)."""
