from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from gyre_web.cluster.views import GpuViewSet
from gyre_web.runs.views import ExperimentViewSet, RunViewSet
from gyre_web.teams.views import ApiTokenViewSet, ShareLinkViewSet, TeamViewSet
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

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/auth/", include("rest_framework.urls")),
    path("api/", include(router.urls)),
]
