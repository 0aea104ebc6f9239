"""`--backup` copies checkpoints to the controller while `fab train` follows: with `--detach` an asked-for
copy is refused before any host is reached, never silently off (train.run.session)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from train.errors import OptionError
from train.run import session


def test_a_backup_asked_for_with_detach_is_refused_naming_why_before_any_host_is_reached():
    request = session.TrainRequest(detach=True, backup="every:15")
    with pytest.raises(OptionError) as refused:
        session.train(request, hosts=[], known=[], console=Console(file=io.StringIO()))
    assert refused.value.option == "--backup" and "--detach returns at once" in str(refused.value)
    assert "--backup off" in str(refused.value)


def test_detached_without_a_backup_asked_for_or_with_backup_off_goes_on():
    out = Console(file=io.StringIO())
    for backup in (None, "off", "OFF"):
        session.backup_while_detached(session.TrainRequest(detach=True, backup=backup), out)
    session.backup_while_detached(session.TrainRequest(detach=False, backup="every:15"), out)
