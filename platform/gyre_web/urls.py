from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from gyre_web import ops, spa
from gyre_web.alerts.views import WebhookViewSet
from gyre_web.cluster.views import GpuViewSet
from gyre_web.datasets.views import DatasetViewSet
from gyre_web.runs import config_views
from gyre_web.runs.views import ExperimentViewSet, RunViewSet
from gyre_web.sweeps.views import SweepViewSet
from gyre_web.teams.views import ApiTokenViewSet, ShareLinkViewSet, TeamViewSet, session
from gyre_web.trajectories.views import RolloutViewSet, TreeViewSet

router = DefaultRouter()
router.register("teams", TeamViewSet, basename="team")
router.register("experiments", ExperimentViewSet, basename="experiment")
router.register("runs", RunViewSet, basename="run")
router.register("rollouts", RolloutViewSet, basename="rollout")
router.register("trees", TreeViewSet, basename="tree")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("share-links", ShareLinkViewSet, basename="share-link")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("sweeps", SweepViewSet, basename="sweep")
router.register("datasets", DatasetViewSet, basename="dataset")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its script from a URL, so the page needs no inline script (CSP).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="docs"),
    path("api/auth/session/", session, name="session"),
    path("api/auth/", include("rest_framework.urls")),
    path("api/config/schema/", config_views.schema, name="config-schema"),
    path("api/config/presets/", config_views.presets, name="config-presets"),
    path("api/", include(router.urls)),
    re_path(r"^assets/(?P<path>.+)$", spa.asset),
    re_path(r"^(?!api/|admin/|ws/|assets/|healthz|readyz|metrics)(?P<path>.*)$", spa.index),
]

# JSON for /api/ paths (HTML pages elsewhere), never a traceback.
handler400 = "gyre_web.inputs.bad_request"
handler403 = "gyre_web.inputs.permission_denied"
handler404 = "gyre_web.inputs.page_not_found"
handler500 = "gyre_web.inputs.server_error"
