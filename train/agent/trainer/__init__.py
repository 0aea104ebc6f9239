"""fairseq's trainer as tandem runs it: the patched entry point (fairseq_train) and its switches (the
communication strategies' hooks comm_*, fused_loss, fast_steps, compiled_layers, profile, the
trackers' keys), and what a checkpoint holds (checkpoint_info)."""
