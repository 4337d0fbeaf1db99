"""`quantkit tune`: the draft options swept, measured and estimated; one recommended."""
