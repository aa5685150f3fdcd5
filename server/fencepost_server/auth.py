"""Caller identity. Until authentication is configured, every caller is the
single default tenant (loopback-only local development)."""

from __future__ import annotations

import grpc

from .api.base import Caller


class DefaultTenantAuthenticator:
    """No authentication: every caller is `tenant`, with the operator role."""

    def __init__(self, tenant: str = "default") -> None:
        self._caller = Caller(tenant=tenant, role="operator", subject="anonymous")

    def identify(self, context: grpc.aio.ServicerContext) -> Caller:
        return self._caller

    def describe(self) -> str:
        return f"no authentication; every caller is tenant {self._caller.tenant!r}"
