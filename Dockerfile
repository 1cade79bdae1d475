# syntax=docker/dockerfile:1
# Two images from one checkout:
#   docker build --target api    -t detlab-api .      # API and migrations; no torch
#   docker build --target worker -t detlab-worker .   # GPU worker on the PyTorch CUDA image
# docker-compose.yml builds both.

ARG PYTHON_IMAGE=python:3.11-slim
# The worker keeps this image's CUDA build of torch; pyproject's worker extra allows >=2.4,<=2.13.
ARG TORCH_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

FROM ${PYTHON_IMAGE} AS api
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY detlab ./detlab
COPY backend ./backend
COPY worker ./worker
COPY frontend ./frontend
COPY migrations ./migrations
RUN pip install '.[server]' && cd / && rm -rf /src \
 && useradd --create-home --uid 10001 detlab
USER detlab
WORKDIR /home/detlab
EXPOSE 8000
CMD ["detlab", "api", "--host", "0.0.0.0", "--port", "8000"]

FROM ${TORCH_IMAGE} AS worker
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY detlab ./detlab
COPY backend ./backend
COPY worker ./worker
COPY frontend ./frontend
COPY migrations ./migrations
# Everything pyproject asks for (base + worker extra) except torch, read from pyproject so the two
# never drift; then detlab itself with --no-deps, so pip cannot swap the image's CUDA torch for a
# PyPI build. The last check fails the build if that happened anyway.
RUN python -c "import re, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
deps = p['dependencies'] + p['optional-dependencies']['worker']; \
print(*[d for d in deps if re.match('[A-Za-z0-9_.-]+', d).group().lower() != 'torch'], sep=chr(10))" \
    > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && pip install --no-deps . \
 && python -c "import torch; assert torch.version.cuda, 'torch in the worker image lost its CUDA build'" \
 && cd / && rm -rf /src /tmp/requirements.txt \
 && useradd --create-home --uid 10001 detlab
USER detlab
WORKDIR /home/detlab
CMD ["detlab", "worker", "--queue", "default"]
