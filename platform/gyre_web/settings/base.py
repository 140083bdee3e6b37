"""Apps, middleware, REST framework and OpenAPI: what does not depend on the environment."""

from gyre_web.settings.env import REPO

BASE_DIR = REPO
ROOT_URLCONF = "gyre_web.urls"
WSGI_APPLICATION = "gyre_web.wsgi.application"
ASGI_APPLICATION = "gyre_web.asgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATIC_ROOT = REPO / ".data" / "static"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "channels",
    "gyre_web.teams",
    "gyre_web.runs",
    "gyre_web.cluster",
    "gyre_web.trajectories",
    "gyre_web.alerts",
    "gyre_web.sweeps",
    "gyre_web.datasets",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "gyre_web.csp.CspMiddleware",  # Content-Security-Policy (gyre_web.settings.tls)
    "gyre_web.inputs.QueryParamsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "gyre_web.teams.lockout.LoginLockoutMiddleware",  # 429 for a locked sign-in
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

REST_FRAMEWORK = {
    "DEFAULT_PARSER_CLASSES": [
        "gyre_web.inputs.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gyre_web.teams.auth.TokenAuthentication",
        "gyre_web.teams.auth.ShareLinkAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["gyre_web.access.MemberOrShareLinkReadOnly"],
    "DEFAULT_PAGINATION_CLASS": "gyre_web.access.IdCursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "gyre_web.openapi.ApiAutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Gyre platform API",
    "DESCRIPTION": "Launch, watch, compare and share elastic RL training runs.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Choice sets that share a field name get a name each (else check --deploy warns W001).
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "gyre_web.runs.models.Status",
        "ExportStatusEnum": "gyre_web.runs.models.ExportStatus",
        "RunSourceEnum": "gyre_web.runs.models.Source",
        "LogSourceEnum": "gyre_web.runs.models.LogSource",
    },
}
