"""What provisioning runs on the controller: the offline wheelhouse the hosts install from
(wheelhouse) and whether the network figures still stand or must be measured again (remeasure, read by
roles/network's and roles/verify's filter plugins)."""
