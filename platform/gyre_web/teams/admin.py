from django.contrib import admin

from gyre_web.teams.models import ApiToken, Membership, ShareLink, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("team", "user", "role")
    list_filter = ("role",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("digest", "prefix")


@admin.register(ShareLink)
class ShareLinkAdmin(admin.ModelAdmin):
    list_display = ("prefix", "team", "experiment", "run", "created_at", "revoked_at")
    readonly_fields = ("digest", "prefix")
