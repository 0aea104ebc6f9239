"""`fab init`: a new cluster's inventory written from the hosts themselves (spec: what the user said;
probe: what each host answers; check and fixes: each problem with its fix; peer_address: where the
peers reach a host), and which inventory every task reads (inventory)."""
