# The store's command-line tool, for docker-compose.yml's `invalidate` service
# (and any other `store` command run beside the compose servers).
FROM python:3.11-slim
COPY . /src
RUN pip install --no-cache-dir "/src[metrics,postgres]" && rm -rf /src
ENTRYPOINT ["store"]
