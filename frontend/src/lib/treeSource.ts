// Where the tree browser gets nodes: the REST API (lazy, paginated), or memory (the
// in-browser benchmark and tests).

import { api, qs } from "./api";
import { ROOT } from "./tree";
import type { Page, TreeNode } from "./types";

export interface TreeSource {
  /** A page of children of `parent` (ROOT for the roots); `next` continues it. */
  children(parent: number, next?: string): Promise<{ nodes: TreeNode[]; next: string | null }>;
  search(text: string): Promise<TreeNode[]>;
  /** The nodes from the root down to `id`, inclusive. */
  path(id: number): Promise<TreeNode[]>;
}

export function apiTreeSource(treeId: number, pageSize = 200): TreeSource {
  return {
    async children(parent, next) {
      const url = next ?? `/api/trees/${treeId}/nodes/${qs({ parent: parent === ROOT ? null : parent, page_size: pageSize })}`;
      const page = await api<Page<TreeNode>>(url);
      return { nodes: page.results, next: page.next ? relative(page.next) : null };
    },
    search: (text) => api<TreeNode[]>(`/api/trees/${treeId}/search/${qs({ q: text })}`),
    path: (id) => api<TreeNode[]>(`/api/trees/${treeId}/path/${id}/`),
  };
}

function relative(url: string): string {
  const u = new URL(url, window.location.origin);
  return u.pathname + u.search;
}

export function memoryTreeSource(nodes: TreeNode[]): TreeSource {
  const byParent = new Map<number, TreeNode[]>();
  const byId = new Map<number, TreeNode>();
  for (const n of nodes) {
    const key = n.parent ?? ROOT;
    const list = byParent.get(key);
    if (list) list.push(n);
    else byParent.set(key, [n]);
    byId.set(n.id, n);
  }
  return {
    children: async (parent) => ({ nodes: byParent.get(parent) ?? [], next: null }),
    search: async (text) => nodes.filter((n) => n.preview.includes(text)).slice(0, 200),
    path: async (id) => {
      const out: TreeNode[] = [];
      for (let n = byId.get(id); n; n = n.parent === null ? undefined : byId.get(n.parent)) out.unshift(n);
      return out;
    },
  };
}
