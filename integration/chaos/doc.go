// Package chaos is the process-level fault suite run by `make chaos`
// against `make cluster` (docs/architecture.md §12, "The local cluster and
// the fault suite"). Its test is behind the build tag chaos, so `make test`
// compiles this package and runs nothing of it.
package chaos
