"""fairseq's JSON log → records and progress (update, loss, s/update, wps, ETA)."""

from __future__ import annotations

from train.recipe.logformat import format_eta, parse_log, parse_record, progress, seconds_per_update

CONFIG = (
    "2026-11-22 07:52:34 | INFO | fairseq_cli.train | {'_name': None, 'optimization': "
    "{'_name': None, 'max_epoch': 0, 'max_update': 600, 'stop_time_hours': 0.0}}"
)
DEVICES = "2026-11-22 07:52:34 | INFO | fairseq_cli.train | training on 2 devices (GPUs/TPUs)"


def inner(update: int, wall: int, loss: float = 5.0, wps: float = 15000.0) -> str:
    return (
        f'2026-11-22 07:53:{update % 60:02d} | INFO | train_inner | {{"epoch": 2, "update": 1.5, '
        f'"loss": "{loss}", "nll_loss": "4.9", "wps": "{wps}", "ups": "2.5", "wpb": "6490.3", '
        f'"bsz": "510.4", "num_updates": "{update}", "lr": "0.0045", "gnorm": "0.902", '
        f'"train_wall": "4", "wall": "{wall}"}}'
    )


VALID = (
    '2026-11-22 07:53:17 | INFO | valid | {"epoch": 2, "valid_loss": "5.43", "valid_nll_loss": "4.638", '
    '"valid_ppl": "24.9", "valid_wpb": "3819", "valid_num_updates": "92", "valid_best_loss": "5.43"}'
)
TRAIN = (
    '2026-11-22 07:53:17 | INFO | train | {"epoch": 2, "train_loss": "6.697", "train_wps": "14141.4", '
    '"train_num_updates": "92", "train_train_wall": "20", "train_wall": "43"}'
)


def test_values_become_numbers_and_prefixes_go():
    record = parse_record(inner(50, 23))
    assert record.kind == "train_inner"
    assert record.stats["num_updates"] == 50 and record.stats["loss"] == 5.0 and record.stats["wall"] == 23
    valid = parse_record(VALID)
    assert valid.kind == "valid" and valid.get("loss") == 5.43 and valid.update == 92
    train = parse_record(TRAIN)
    assert train.get("wall") == 43 and train.get("train_wall") == 20 and train.update == 92


def test_other_lines_are_not_records():
    assert parse_record(DEVICES) is None
    assert parse_record("  key_padding_mask = _canonical_mask(") is None
    assert parse_record("2026-11-22 07:53:17 | INFO | train_inner | {not json") is None


def test_progress_of_a_running_job():
    lines = [CONFIG, DEVICES] + [inner(u, u // 2) for u in range(10, 110, 10)] + [VALID]
    p = progress(parse_log(lines))
    assert p.devices == 2
    assert p.update == 100 and p.max_update == 600
    assert p.seconds_per_update == 0.5
    assert p.loss == 5.0 and p.valid_loss == 5.43 and p.wps == 15000.0
    assert p.eta_seconds == 250.0 and format_eta(p.eta_seconds) == "4m10s"
    assert not p.finished


def test_resume_restarts_wall_without_breaking_the_rate():
    first = [inner(u, u) for u in range(10, 60, 10)]  # 1 s/update
    resumed = [
        "2026-11-22 08:00:00 | INFO | fairseq.trainer | Loaded checkpoint /d/checkpoint_last.pt (epoch 2 @ 50 updates)"
    ]
    second = [inner(u, (u - 50) // 5) for u in range(60, 110, 10)]  # wall restarts at 0: 0.2 s/update
    log = parse_log(first + resumed + second)
    assert log.resumed_from == [50]
    rate = seconds_per_update(log.records)
    assert rate is not None and 0.19 < rate < 0.21
    assert progress(log, max_update=1000).update == 100


def test_resumed_but_not_logged_yet_reports_the_checkpoint_update():
    log = parse_log([CONFIG, "x | INFO | fairseq.trainer | Loaded checkpoint c.pt (epoch 3 @ 1200 updates)"])
    assert progress(log).update == 1200


def test_finished_and_rate_from_ups_when_one_line():
    log = parse_log([inner(10, 4), "2026-11-22 07:53:21 | INFO | fairseq_cli.train | done training in 44.3 seconds"])
    p = progress(log, max_update=10)
    assert p.finished and p.seconds_per_update == 0.4 and p.eta_seconds == 0
    assert format_eta(None) == "?" and format_eta(3725) == "1h02m"
