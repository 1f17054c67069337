# syntax=docker/dockerfile:1
# The orderpipe image: one static binary, every part is a subcommand
# (compose.yaml runs `orderpipe producer`, `orderpipe consumers`, ...).

# --- build ---------------------------------------------------------------
FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/orderpipe . \
 && /out/orderpipe help >/dev/null

# --- run -----------------------------------------------------------------
FROM debian:trixie-slim
# CA roots for https webhooks and a real payment provider; nothing else is
# installed (the healthcheck is `orderpipe probe`, not curl).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/orderpipe /usr/local/bin/orderpipe
# Not root: a numeric user that owns nothing in the image.
USER 65532:65532
ENV HTTP_ADDR=:8080 \
    ORDERPIPE_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["orderpipe", "probe"]
ENTRYPOINT ["orderpipe"]
CMD ["help"]
