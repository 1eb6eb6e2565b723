// Package integration holds hedgerow's multi-node and multi-process tests
// (docs/architecture.md §12): a NATS cluster losing a node under load, and the hedgerow
// binary's gateway and worker processes against an external nats-server
// process, with a worker killed while it holds an attempt. It has no code
// of its own beyond its tests; `go test ./integration/` runs them all,
// building the binaries it needs.
package integration
