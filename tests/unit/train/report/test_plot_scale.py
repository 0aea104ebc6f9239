"""The throughput plots stay scaled to the traffic; the link is a labelled line or a note."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from train.report import plots  # noqa: E402


def test_traffic_far_below_the_link_is_drawn_at_its_own_scale_and_the_link_is_a_note():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [30, 36])
    plots.mark_link(ax, 6600, 36, "k")
    assert ax.get_ylim()[1] < 50  # not 6600: a flat line at zero otherwise
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["link 6600 Mbit/s, above the plot: the traffic peaked at 36 Mbit/s (0.5% of it)"]
    plt.close(fig)


def test_a_link_near_the_traffic_is_a_labelled_line():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [80, 95])
    plots.mark_link(ax, 100, 95, "k")
    assert ax.get_ylim()[1] >= 110 and [line.get_label() for line in ax.lines][-1] == "link 100 Mbit/s"
    assert not ax.texts
    plt.close(fig)
