"""What a run is, below everything that plans, starts, reports or watches one: the model's size
(params), and the communication strategies (strategies: one module per `--comm` value, a registry
that parses the text once into a typed value, and the one ladder `--comm auto` climbs).
It imports nothing of tandem's above it."""
