"""Group word problems S3, S4, A5, S5 (the paper's state-tracking experiment, Fig. 5 / Fig. 7 / Fig. 12)."""
