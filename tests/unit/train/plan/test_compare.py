"""Every host subset × comm strategy, priced: the comparison `fab predict` prints and `fab train`'s
fewer-hosts refusal, for figures tandem measured (benchmarks/README.md): the lab's tiny and
13× tiny on 2 CPU hosts at 10 Mbit/s–1 Gbit/s, and the H100's base/big on 2 × 8 GPUs at 1–100 Gb/s."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, Host, load_hosts
from train.plan import compare, predict, price
from train.recipe.params import transformer_params

TINY = 296_448  # bench-step, tiny: C 0.165 s
TINY_13X = 3_938_304  # bench-step, 13× tiny: C 0.848 s on the quiet machine
BASE = transformer_params(32000, 512, 2048, 6, 6)
BIG = transformer_params(32000, 1024, 4096, 6, 6)  # 418 MB of fp16 gradients


def lab(prices=(None, None)) -> list[Host]:
    return [Host(name=n, address=n, vars={"hourly_usd": p} if p is not None else {})
            for n, p in zip(("v100a", "v100b"), prices, strict=False)]


def h100s(price_each: float | None = None, n: int = 2) -> list[Host]:
    return [Host(name=f"h100-{i}", address=f"h{i}", gpus=8, vars={"hourly_usd": price_each} if price_each else {})
            for i in range(n)]


def row(c: compare.Comparison, hosts: int, kind: str) -> compare.Option:
    return next(o for o in c.options if len(o.hosts) == hosts and o.kind == kind)


def test_tiny_at_10mbit_one_host_is_faster_than_two_and_local_sgd_fastest():
    c = compare.compare(lab(), TINY, link_mbps=10, compute_s=0.165, max_update=1000, tokens_per_batch=2048)
    fewer = c.fewer_hosts_faster
    assert fewer is not None and fewer.hosts == ("v100a",)
    assert fewer.flags() == "--hosts v100a --update-freq 2"  # the run's batch per update, on one host
    assert fewer.batches_per_s == pytest.approx(1 / 0.165)
    assert c.asked.batches_per_s == pytest.approx(2 / (0.165 + TINY * 4 / 1.25e6))
    verdict = c.verdict()
    assert any(line.startswith("one host is faster than two on this link") for line in verdict)
    assert c.fastest.kind == "local-sgd" and c.fastest.prediction.efficiency >= 0.9
    assert verdict[0].startswith("fastest: 2 hosts, local-sgd:")
    assert "bench-quality" in c.fastest.caveat  # the quality it may cost, said beside the speed


@pytest.mark.parametrize("mbit", [100, 1000])
def test_tiny_at_100mbit_and_1gbit_two_hosts_are_faster(mbit):
    c = compare.compare(lab(), TINY, link_mbps=mbit, compute_s=0.165, max_update=1000)
    assert c.fewer_hosts_faster is None
    assert len(c.fastest.hosts) == 2
    assert not any("faster than two" in line for line in c.verdict())


def test_13x_tiny_one_host_beats_sync_at_10mbit_and_local_sgd_beats_both():
    c = compare.compare(lab(), TINY_13X, link_mbps=10, compute_s=0.848, max_update=1000, tokens_per_batch=2048)
    assert c.fewer_hosts_faster is not None
    # measured on the lab: sync 13 s an update at 10mbit, local SGD at 86% of the uncapped speed
    assert row(c, 2, "sync").prediction.step_s == pytest.approx(13.45, abs=0.1)
    assert c.fastest.kind == "local-sgd"
    assert c.fastest.hours < c.fewer_hosts_faster.hours < c.asked.hours


def test_13x_tiny_at_1gbit_two_hosts_are_faster():
    c = compare.compare(lab(), TINY_13X, link_mbps=1000, compute_s=0.848, max_update=1000)
    assert c.fewer_hosts_faster is None and len(c.fastest.hosts) == 2


@pytest.mark.parametrize("gbit, one_host_faster", [(1, True), (10, True), (25, True), (100, False)])
def test_h100_base_on_two_hosts_of_8_gpus(gbit, one_host_faster):
    """base fp16, C 0.061 s at 4,096 tokens: 16 GPUs need 100 Gb/s to beat the 8 of one host."""
    c = compare.compare(h100s(), BASE, link_mbps=gbit * 1000, compute_s=0.061, precision="fp16",
                        max_update=100_000, tokens_per_batch=4096)
    assert (c.fewer_hosts_faster is not None) == one_host_faster
    assert row(c, 1, "sync").tokens_per_s == pytest.approx(8 * 4096 / 0.061)
    assert not any(o.kind == "fp16" for o in c.options)  # fp16 training already all-reduces 2 bytes


def test_h100_big_at_100gbit_two_hosts_are_barely_faster():
    c = compare.compare(h100s(), BIG, link_mbps=100_000, compute_s=0.074, precision="fp16", max_update=100_000)
    assert c.fewer_hosts_faster is None
    assert c.asked.batches_per_s / row(c, 1, "sync").batches_per_s == pytest.approx(1.06, abs=0.05)


def test_dollars_are_hours_times_every_hosts_price_and_the_cheapest_is_named():
    c = compare.compare(h100s(price_each=2.5), BASE, link_mbps=1000, compute_s=0.061, precision="fp16",
                        max_update=100_000)
    one, two = row(c, 1, "sync"), c.asked
    assert one.usd_per_hour == 2.5 and two.usd_per_hour == 5.0
    assert one.dollars == pytest.approx(one.hours * 2.5)
    assert c.cheapest == one
    assert any(line.startswith("cheapest: 1 host") for line in c.verdict())


def test_a_missing_price_leaves_dollars_out_never_guessed():
    c = compare.compare(lab(prices=(3.06, None)), TINY, link_mbps=10, compute_s=0.165, max_update=1000)
    assert row(c, 1, "sync").dollars == pytest.approx(row(c, 1, "sync").hours * 3.06)  # v100a has its price
    assert c.asked.dollars is None and c.unpriced == ["v100b"]
    assert "no hourly_usd in the inventory for v100b" in c.verdict()[1]
    assert "—" in c.text()


def test_a_price_that_is_not_a_number_names_the_host():
    with pytest.raises(ClusterError, match="v100b: hourly_usd must be US dollars per hour.*'cheap'"):
        price.hourly_usd(Host(name="v100b", address="x", vars={"hourly_usd": "cheap"}))


def test_the_price_comes_from_group_or_host_vars_of_the_inventory(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    cluster:\n      vars: {hourly_usd: 3.06}\n      hosts:\n"
                    "        v100a: {ansible_host: 10.0.0.1}\n"
                    "        v100b: {ansible_host: 10.0.0.2, hourly_usd: 2.48}\n")
    hosts = load_hosts(path)
    assert [price.hourly_usd(h) for h in hosts] == [3.06, 2.48]
    assert price.cluster_hourly_usd(hosts) == pytest.approx(5.54)


def test_three_hosts_two_of_them_cannot_keep_the_batch():
    three = [Host(name=f"h{i}", address=f"h{i}") for i in range(3)]
    c = compare.compare(three, TINY, link_mbps=10, compute_s=0.165, max_update=1000)
    assert sorted({len(o.hosts) for o in c.options}) == [1, 2, 3]
    two = row(c, 2, "sync")
    assert not two.same_updates and "not the same updates" in two.caveat
    assert row(c, 1, "sync").update_freq == 3
    assert c.fewer_hosts_faster.hosts == ("h0",)  # only runs that train the run's own updates count


def test_the_prediction_says_the_cost_and_that_fewer_hosts_are_faster():
    v = predict.assess(lab(prices=(3.06, 3.06)), TINY, link_mbps=10, link_source="given", compute_s=0.165,
                       compute_source="given", max_update=1000, tokens_per_batch=2048)
    assert v.fewer_hosts_faster is not None
    assert v.cost_line().startswith("predicted ") and "$6.12/h" in v.cost_line()
    assert "verdict: FEWER HOSTS ARE FASTER: --hosts v100a --update-freq 2" in v.lines
    assert v.as_dict()["comparison"]["fewer_hosts_faster"] == "--hosts v100a --update-freq 2"
    fast = predict.assess(lab(), TINY, link_mbps=1000, link_source="given", compute_s=0.165, compute_source="given",
                          max_update=1000)
    assert fast.fewer_hosts_faster is None and "dollars left out" in fast.cost_line()
