/** esbuild (`--loader:.css=text`) and vitest (vitest.config.ts) import CSS as its text. */
declare module "*.css" {
  const css: string;
  export default css;
}
