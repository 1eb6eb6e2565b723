# syntax=docker/dockerfile:1
# hedgerow's image: one static binary, `hedgerow` as the entrypoint, run as a
# non-root user on an empty base (deploy/k8s/README.md). The build is the one
# `make build` and `make cluster` run (same package, same -X main.version),
# with cgo off so the binary needs no C library.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t hedgerow:dev .
#   docker run --rm hedgerow:dev version

# The Go release go.mod names.
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/hedgerow ./cmd/hedgerow \
 && /out/hedgerow version \
 && mkdir -p /out/state

FROM scratch
# Workers call providers over TLS: the build image's CA bundle.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/hedgerow /hedgerow
# The nonroot user of the distroless images; no shell, no package manager.
USER 65532:65532
# serve's embedded JetStream state when nats.store_dir is empty (mount a
# volume there to keep it across containers).
COPY --from=build --chown=65532:65532 /out/state /var/lib/hedgerow
ENV XDG_STATE_HOME=/var/lib/hedgerow
EXPOSE 8080 8081
ENTRYPOINT ["/hedgerow"]
CMD ["--help"]
