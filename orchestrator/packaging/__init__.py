"""Shipping the project to a node with no network: an offline wheelhouse (``make wheelhouse``)."""
