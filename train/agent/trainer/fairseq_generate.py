"""fairseq-generate with its checkpoint loaded as data only: `fab evaluate` runs it.

    python -m train.agent.trainer.fairseq_generate DATA --path CHECKPOINT ...   (fairseq-generate's arguments)

The checkpoint evaluated may have come from a peer or a bucket: a pickle in it that would run code
is refused by name (train/agent/trainer/checkpoints_as_data.py), as in training.
"""

from __future__ import annotations

from train.agent.trainer import checkpoints_as_data


def main() -> None:
    from fairseq_cli.generate import cli_main

    checkpoints_as_data.install()
    cli_main()


if __name__ == "__main__":
    main()
