# syntax=docker/dockerfile:1
# Two images from one file: `api` (web process, no torch) and `worker` (CUDA, torch, DeepSpeed).
# docker-compose.yml builds both; `docker build --target worker .` builds one.

ARG PYTHON_IMAGE=python:3.12-slim
# a devel image: DeepSpeed compiles its ops (cpu_adam, fused_adam) with nvcc on first use
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04

# ---------------------------------------------------------------- api
FROM ${PYTHON_IMAGE} AS api
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TUNEBOX_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY planner/ planner/
COPY store/ store/
COPY api/ api/
COPY worker/ worker/
COPY tunebox/ tunebox/
COPY migrations/ migrations/
RUN pip install -c constraints.txt . && useradd --create-home --uid 1000 tunebox \
    && mkdir -p /data && chown 1000:1000 /data
# uid 1000 in both images: the shared data volume takes the owner of whichever mounts it first
USER 1000
EXPOSE 8000
CMD ["sh", "-c", "tunebox db upgrade && exec tunebox serve --host 0.0.0.0 --port 8000"]

# ---------------------------------------------------------------- worker
FROM ${CUDA_IMAGE} AS worker
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    TUNEBOX_DATA_DIR=/data TUNEBOX_TORCH_EXTENSIONS_DIR=/cache/torch_extensions \
    TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0"
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
        build-essential ninja-build libaio-dev && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
# torch first, from the CUDA index; the constraints' version pin still applies to it
RUN pip install -c constraints.txt --index-url ${TORCH_INDEX_URL} torch
COPY planner/ planner/
COPY store/ store/
COPY api/ api/
COPY worker/ worker/
COPY tunebox/ tunebox/
COPY migrations/ migrations/
RUN pip install -c constraints.txt ".[train]" && mkdir -p /data /cache/torch_extensions \
    && (id -u 1000 >/dev/null 2>&1 || useradd --create-home --uid 1000 tunebox) \
    && chown -R 1000:1000 /data /cache
USER 1000
CMD ["tunebox", "worker"]
