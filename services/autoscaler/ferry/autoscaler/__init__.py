"""The autoscaler service: grows and shrinks the fleet through a provider (``ferry.fleet``)."""
