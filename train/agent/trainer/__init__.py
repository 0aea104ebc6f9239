"""fairseq's trainer as tandem runs it: the patched entry points (fairseq_train, fairseq_generate), their
checkpoints loaded as data only (checkpoints_as_data), its switches (the communication strategies' hooks
comm_*, fused_loss, fast_steps, compiled_layers, profile, the trackers' keys), and what a checkpoint
holds (checkpoint_info)."""
