"""One JSON-over-HTTPS client for the providers that speak REST (GCP, Azure, Kubernetes): a bearer
token, bounded retries of what may be retried (connection errors, 429, 5xx), and the cloud's error
answers turned into Ferry's (``LaunchRefused`` for the codes a provider names as refusals,
``ProviderError`` for the rest)."""

from collections.abc import Callable, Collection
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from ferry.fleet.provider import LaunchRefused, ProviderError

RETRIED = frozenset({429, 500, 502, 503, 504})


class Failed(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


def _retried(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, Failed) and exc.status in RETRIED)


class Rest:
    def __init__(self, base: str, token: Callable[[], str], what: str, refusals: Collection[str],
                 error_code: Callable[[Any], str], attempts: int = 4, verify: str | bool = True) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.what = what
        self.refusals = frozenset(refusals)
        self.error_code = error_code
        self.attempts = attempts
        self.client = httpx.AsyncClient(timeout=30.0, verify=verify)

    async def _once(self, method: str, path: str, params: dict[str, str] | None, body: Any,
                    content_type: str) -> Any:
        headers = {"Authorization": f"Bearer {self.token()}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        reply = await self.client.request(method, f"{self.base}{path}", params=params, headers=headers,
                                          json=body if body is not None else None)
        try:
            doc = reply.json() if reply.content else {}
        except ValueError:
            doc = {"raw": reply.text[:200]}
        if reply.status_code >= 400:
            code = self.error_code(doc) or str(reply.status_code)
            message = str(doc.get("error", {}).get("message", "") if isinstance(doc.get("error"), dict)
                          else doc.get("message", doc.get("raw", "")))
            raise Failed(reply.status_code, code, message)
        return doc

    async def call(self, method: str, path: str, params: dict[str, str] | None = None, body: Any = None,
                   content_type: str = "application/json", missing_ok: bool = False) -> Any:
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(self.attempts), reraise=True,
                                               wait=wait_exponential(multiplier=0.2, max=5),
                                               retry=retry_if_exception(_retried)):
                with attempt:
                    return await self._once(method, path, params, body, content_type)
        except Failed as exc:
            if missing_ok and exc.status == 404:
                return None
            kind = LaunchRefused if exc.code in self.refusals else ProviderError
            raise kind(f"{self.what} {method} {path}: {exc}") from None
        except httpx.HTTPError as exc:
            raise ProviderError(f"{self.what} {method} {path}: {exc}") from exc
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self.client.aclose()
