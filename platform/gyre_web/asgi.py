"""ASGI entry point (daphne): HTTP through Django, ``/ws/`` through the run-events consumer.

daphne -b 127.0.0.1 -p 8000 gyre_web.asgi:application   (with platform/ on PYTHONPATH)
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gyre_web.settings")
django_http = get_asgi_application()  # sets Django up before the consumer's imports

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from gyre_web.realtime.consumers import RunEventsConsumer  # noqa: E402
from gyre_web.ws_auth import WebsocketAuthMiddleware  # noqa: E402

websocket_urls = [path("ws/", RunEventsConsumer.as_asgi())]

application = ProtocolTypeRouter(
    {
        "http": django_http,
        "websocket": AllowedHostsOriginValidator(
            WebsocketAuthMiddleware(URLRouter(websocket_urls))
        ),
    }
)
