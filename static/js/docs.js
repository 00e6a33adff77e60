// Swagger UI for /openapi.json, served from static/vendor: the API docs work offline.
window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
