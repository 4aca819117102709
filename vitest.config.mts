import { readFileSync } from "node:fs";
import { defineConfig, type Plugin } from "vitest/config";

/** Load `*.css` imports as text, the way esbuild's `--loader:.css=text` does for the bundle. */
function cssAsText(): Plugin {
  const prefix = "\0css-text:";
  return {
    name: "ndbg-css-as-text",
    enforce: "pre",
    async resolveId(source, importer) {
      if (!source.endsWith(".css")) return null;
      const resolved = await this.resolve(source, importer, { skipSelf: true });
      return resolved ? `${prefix}${resolved.id}.js` : null;
    },
    load(id) {
      if (!id.startsWith(prefix)) return null;
      const file = id.slice(prefix.length, -".js".length);
      return `export default ${JSON.stringify(readFileSync(file, "utf8"))};`;
    },
  };
}

export default defineConfig({
  plugins: [cssAsText()],
  test: {
    environment: "happy-dom",
    include: ["js/**/*.test.ts"],
  },
});
