// Swagger UI for /openapi.json, served from vendor/swagger-ui: the API docs work offline.
window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
