"""Providers of nodes: where the autoscaler launches and terminates them (``ferry.fleet.provider``)."""
