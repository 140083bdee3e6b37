// The one HTTP client: session cookie + CSRF for the signed-in browser, or the share-link
// key (X-Gyre-Share) for a read-only shared view.

import type { Page } from "./types";

let shareKey: string | null = null;

export function setShareKey(key: string | null): void {
  shareKey = key;
}

export function getShareKey(): string | null {
  return shareKey;
}

export class ApiError extends Error {
  constructor(
    public status: number,
    public body: unknown,
  ) {
    super(`HTTP ${status}: ${describe(body)}`);
  }
}

function describe(body: unknown): string {
  if (body && typeof body === "object" && "detail" in body) return String(body.detail);
  if (typeof body === "string") return body.slice(0, 200);
  return JSON.stringify(body)?.slice(0, 200) ?? "";
}

export function csrfToken(): string {
  const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}

export async function api<T>(path: string, init: RequestInit & { json?: unknown } = {}): Promise<T> {
  const headers = new Headers(init.headers);
  headers.set("Accept", "application/json");
  if (shareKey) headers.set("X-Gyre-Share", shareKey);
  const method = (init.method ?? "GET").toUpperCase();
  if (method !== "GET" && method !== "HEAD") headers.set("X-CSRFToken", csrfToken());
  let body = init.body;
  if (init.json !== undefined) {
    headers.set("Content-Type", "application/json");
    body = JSON.stringify(init.json);
  }
  const res = await fetch(path, { ...init, method, headers, body, credentials: "same-origin" });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    // not JSON (an HTML error page): keep the text
  }
  if (!res.ok) throw new ApiError(res.status, parsed);
  return parsed as T;
}

/** Every page of a cursor-paginated collection (bounded by `maxPages`). */
export async function listAll<T>(path: string, maxPages = 20): Promise<T[]> {
  const out: T[] = [];
  let url: string | null = path;
  for (let i = 0; url && i < maxPages; i++) {
    const page: Page<T> | T[] = await api<Page<T> | T[]>(url);
    if (Array.isArray(page)) return page;
    out.push(...page.results);
    url = page.next ? toRelative(page.next) : null;
  }
  return out;
}

function toRelative(url: string): string {
  const u = new URL(url, window.location.origin);
  return u.pathname + u.search;
}

/** Django session login through DRF's login view (form POST with the CSRF cookie). */
export async function login(username: string, password: string): Promise<void> {
  await fetch("/api/auth/login/", { credentials: "same-origin" }); // sets csrftoken
  const form = new URLSearchParams({
    username,
    password,
    csrfmiddlewaretoken: csrfToken(),
    next: "/api/teams/",
  });
  const res = await fetch("/api/auth/login/", {
    method: "POST",
    body: form,
    credentials: "same-origin",
    headers: { "X-CSRFToken": csrfToken() },
  });
  if (res.status === 429) {
    // too many failed sign-ins: the server names the wait (JSON, with Retry-After)
    const body = await res.json().catch(() => ({}));
    throw new Error(body.detail ?? "too many failed sign-ins; try again later");
  }
  if (!(await isSignedIn())) throw new Error("wrong username or password");
}

export async function logout(): Promise<void> {
  await fetch("/api/auth/logout/", {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-CSRFToken": csrfToken() },
  });
}

/** GET /api/auth/session/: who the caller is. Signed out is a 200 answer, not an error. */
export interface Session {
  authenticated: boolean;
  username: string | null;
  staff: boolean;
}

export async function isSignedIn(): Promise<boolean> {
  try {
    return (await api<Session>("/api/auth/session/")).authenticated;
  } catch {
    return false; // refused credentials (a revoked share key) or no server: sign in
  }
}

export function qs(params: Record<string, string | number | undefined | null>): string {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") p.set(k, String(v));
  const s = p.toString();
  return s ? `?${s}` : "";
}
