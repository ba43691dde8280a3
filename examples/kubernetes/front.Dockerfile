# The image of specdeploy's name-routing front (deploy.front_image): an OpenAI client reaches each
# fine-tune of a LoRA group on target pytorch by its own model name. The front is three files of this
# repository and three pinned packages (the versions pyproject.toml pins); it runs as a non-root user
# on a read-only root file system. Build it from the repository's root:
#   docker build -f examples/kubernetes/front.Dockerfile -t registry.example.com/specdeploy-front:0.1.0 .
FROM python:3.11-slim
RUN pip install --no-cache-dir fastapi==0.165.0 uvicorn==0.55.0 httpx==0.29.0
COPY pipeline/__init__.py /app/pipeline/__init__.py
COPY pipeline/llm_api/__init__.py /app/pipeline/llm_api/__init__.py
COPY pipeline/llm_api/front.py /app/pipeline/llm_api/front.py
ENV PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1
USER 1000:1000
