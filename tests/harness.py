"""Test helpers: the gateway launcher lives in ``gateway.launcher``."""

from gateway.launcher import BANNER, GatewayProcess  # noqa: F401
