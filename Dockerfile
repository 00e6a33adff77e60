# GRPO Lens, self-hosted: docker build -t grpo-lens . && docker run -p 8000:8000 grpo-lens
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# torch first, pinned, the CPU build (a CUDA base image and build are the user's choice).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY grpo ./grpo
COPY app ./app
COPY templates ./templates
COPY static ./static
COPY vendor ./vendor
RUN pip install .

RUN useradd --system --uid 10001 lens
USER lens
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000", "--http", "app.server:HeaderTimeoutH11"]
