# syntax=docker/dockerfile:1
# hedgerow's image: one static binary, `hedgerow` as the entrypoint, run as a
# non-root user (65532) on an empty base (deploy/k8s/README.md). The build is
# deploy/image/build.sh, the same package and -X main.version as `make
# build`, with cgo off so the binary needs no C library.
#
# With access to a registry holding the official Go image, GO_IMAGE names it
# fully qualified (the registry's host, then library/golang) at the release
# go.mod names, 1.26.8; a release pins it by digest, TAG@sha256:..., the
# digest `docker buildx imagetools inspect` or `skopeo inspect` prints for
# that tag:
#
#   docker build --build-arg GO_IMAGE=REGISTRY/library/golang:1.26.8 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t hedgerow:dev .
#   docker run --rm hedgerow:dev version
#
# Without one, `make image` builds this file's final stage as it is with
# podman: deploy/image/build.sh lays the build stage's files out in
# bin/image/build, handed over as the build context named `build` (which
# takes the stage's place, so no image is pulled).

ARG GO_IMAGE
FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN sh deploy/image/build.sh / "${VERSION}"

FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="hedgerow" \
      org.opencontainers.image.description="Delayed, bounded, cancellable hedged requests for LLM APIs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/hedgerow/hedgerow" \
      org.opencontainers.image.licenses="Apache-2.0"
# Workers call providers over TLS: Debian's CA bundle.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/hedgerow /hedgerow
# The nonroot user of the distroless images; no shell, no package manager.
USER 65532:65532
# serve's embedded JetStream state when nats.store_dir is empty (mount a
# volume there to keep it across containers, or a tmpfs with a read-only
# root file system).
COPY --from=build --chown=65532:65532 /out/state /var/lib/hedgerow
ENV XDG_STATE_HOME=/var/lib/hedgerow
# No HEALTHCHECK: one image runs five roles (serve, gateway, worker,
# fakellm, nats-auth), each probed on its own port; compose gives each
# service its `hedgerow healthcheck URL` and Kubernetes its probes.
EXPOSE 8080 8081
ENTRYPOINT ["/hedgerow"]
CMD ["--help"]
