"""Tasks built on the core and the training engine: each supplies its data, loss and evaluation."""
