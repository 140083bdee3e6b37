"""OpenAPI descriptions of the token and share-link authentication schemes."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class TokenScheme(OpenApiAuthenticationExtension):  # type: ignore[misc]
    target_class = "gyre_web.teams.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>` or `Bearer <key>` (create one at /api/tokens/)",
        }


class ShareLinkScheme(OpenApiAuthenticationExtension):  # type: ignore[misc]
    target_class = "gyre_web.teams.auth.ShareLinkAuthentication"
    name = "shareLink"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "X-Gyre-Share",
            "description": "a share link key: read-only access to one experiment or run",
        }
