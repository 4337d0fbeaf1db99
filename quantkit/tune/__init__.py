"""`quantkit tune`: sweep a draft's options on its pair, measure AL, estimate cost, recommend one."""
