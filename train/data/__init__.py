"""Preparing data on the controller: download, clean, subwords, fairseq binaries, then onto every host."""
