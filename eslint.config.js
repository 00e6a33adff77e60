// ESLint for the page's modules (static/js): browser globals, ES modules, plotly.js's global `Plotly`
// (loaded by a script tag when a chart first needs it) and Swagger UI's on the API docs page.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["node_modules/", "vendor/", ".venv/", "test-artifacts/", "build/"] },
  js.configs.recommended,
  {
    files: ["static/js/**/*.js"],
    languageOptions: {
      ecmaVersion: 2024,
      sourceType: "module",
      globals: { ...globals.browser, Plotly: "readonly" },
    },
    // `const { preset, ...edits } = config` is how a field is left out of a copy
    rules: { "no-unused-vars": ["error", { ignoreRestSiblings: true }] },
  },
  {
    files: ["static/js/docs.js"],
    languageOptions: { globals: { SwaggerUIBundle: "readonly" } },
  },
  {
    files: ["eslint.config.js"],
    languageOptions: { sourceType: "module", globals: globals.node },
  },
];
