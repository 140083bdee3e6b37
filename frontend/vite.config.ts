/// <reference types="vitest/config" />
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// Django serves dist/index.html at "/" and the hashed bundles under /assets/.
export default defineConfig({
  base: "/",
  plugins: [react()],
  build: { outDir: "dist", assetsDir: "assets", sourcemap: false },
  server: {
    proxy: {
      "/api": "http://127.0.0.1:8000",
      "/ws": { target: "ws://127.0.0.1:8000", ws: true },
    },
  },
  test: {
    environment: "node", // component tests opt into jsdom with a file comment
    setupFiles: ["src/test/setup-dom.ts"],
    include: ["src/**/*.test.{ts,tsx}"],
  },
});
