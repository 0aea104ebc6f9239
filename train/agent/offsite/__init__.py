"""Checkpoint copies off the cluster (a bucket, a directory, sftp) made by rank 0's host: the target
(target), a copy whole or not at all (copies), when to copy (schedule), the uploader process (upload)."""
