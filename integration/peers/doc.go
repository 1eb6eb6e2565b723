// Package peers compares hedgerow with the hedging libraries a Go team would
// otherwise reach for — github.com/cristalhq/hedgedhttp and failsafe-go's
// hedgepolicy — and with no hedging at all, on one live load: the same three
// seeded fake LLM routes, the same seeded open-loop Poisson arrivals, the
// same P95 hedge delay and the same bound on attempts (docs/architecture.md
// §2, §11).
//
// It has no code of its own beyond its tests, so the peer libraries are
// test dependencies only: nothing the hedgerow binary links imports them.
// `go test ./integration/peers/` runs a small smoke run of the harness;
// `make compare-peers` runs the full comparison (BenchmarkComparePeers) and
// prints the side-by-side table.
package peers
