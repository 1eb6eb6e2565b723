#!/bin/sh
# What the image's final stage copies from its build stage (Dockerfile), laid
# out under ROOT as the build stage's file system has it: the static binary
# at ROOT/out/hedgerow, an empty ROOT/out/state (serve's JetStream state),
# and the CA bundle at ROOT/etc/ssl/certs/ca-certificates.crt (Debian's
# ca-certificates, as in the Go build image). The Dockerfile's build stage
# runs it with ROOT=/; `make image` runs it with ROOT=bin/image/build and
# hands that folder to the final stage as the `build` context, so both
# images hold the same files. Run from the repository's root.
#
#   deploy/image/build.sh ROOT [VERSION]
set -eu
root=${1:?usage: deploy/image/build.sh ROOT [VERSION]}
version=${2:-dev}
mkdir -p "$root/out/state" "$root/etc/ssl/certs"
CGO_ENABLED=0 ${GO:-go} build -trimpath -ldflags "-s -w -X main.version=$version" -o "$root/out/hedgerow" ./cmd/hedgerow
"$root/out/hedgerow" version
ca=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$ca" ]; then
	echo "deploy/image/build.sh: no CA bundle at $ca (Debian: apt-get install ca-certificates)" >&2
	exit 1
fi
if [ ! "$root/etc/ssl/certs/ca-certificates.crt" -ef "$ca" ]; then
	cp "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
fi
