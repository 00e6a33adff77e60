// Swagger UI for /openapi.json, served from vendor/swagger-ui: the API docs work offline.
SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
